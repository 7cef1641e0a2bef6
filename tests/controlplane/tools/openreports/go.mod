// Pins the OpenReports API (ClusterReport, Report) whose CRDs the report tests install: the
// build script (component `openreports`) copies config/crd/*.yaml out of this module's copy in
// the Go module cache. No Go package imports it, so never `go mod tidy` here (it would drop the
// requirement); bump with `go get github.com/openreports/reports-api@vX.Y.Z`.
module storageversion-webhook/tests/controlplane/tools/openreports

go 1.26.0

require github.com/openreports/reports-api v0.2.1
