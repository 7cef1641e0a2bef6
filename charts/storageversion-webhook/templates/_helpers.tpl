{{/* Names, labels and the few values derived in more than one template. */}}

{{- define "svw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "svw.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "svw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "svw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "svw.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "svw.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "svw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "svw.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "svw.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "svw.fullname" .)) .Values.certificates.secretName -}}
{{- end -}}

{{- define "svw.leaderLeaseName" -}}
{{- default (printf "%s-gc" (include "svw.fullname" .)) .Values.gc.leaderElection.leaseName -}}
{{- end -}}

{{- define "svw.migrateStateConfigMap" -}}
{{- default (printf "%s-migrate" (include "svw.fullname" .)) .Values.migrate.stateConfigMap -}}
{{- end -}}

{{- define "svw.crdStateConfigMap" -}}
{{- default (printf "%s-crd" (include "svw.fullname" .)) .Values.crdMigrate.stateConfigMap -}}
{{- end -}}

{{- define "svw.reportName" -}}
{{- default (include "svw.fullname" .) .Values.report.name -}}
{{- end -}}

{{- define "svw.crdGuardWebhookName" -}}
{{- printf "crds.%s.%s.svc" (include "svw.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "svw.webhookName" -}}
{{- default (printf "storageversions.%s.%s.svc" (include "svw.fullname" .) .Release.Namespace) .Values.webhook.name -}}
{{- end -}}

{{/* The Service's DNS names, which the serving certificate must cover. */}}
{{- define "svw.dnsNames" -}}
{{- $svc := include "svw.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson -}}
{{- end -}}

{{- define "svw.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* host:port for a listen flag; IPv6 hosts get brackets. */}}
{{- define "svw.listenAddr" -}}
{{- $host := index . 0 -}}
{{- $port := index . 1 -}}
{{- if contains ":" $host -}}
{{- printf "[%s]:%v" $host $port -}}
{{- else -}}
{{- printf "%s:%v" $host $port -}}
{{- end -}}
{{- end -}}

{{/* Checks of values the schema cannot express. */}}
{{- define "svw.validate" -}}
{{- if and (eq .Values.certificates.mode "secret") (not .Values.certificates.secret.caBundle) -}}
{{- fail "certificates.mode=secret needs certificates.secret.caBundle (the CA that signed the Secret's certificate), e.g. --set-file certificates.secret.caBundle=ca.crt" -}}
{{- end -}}
{{- if and (eq .Values.certificates.mode "secret") (not .Values.certificates.secretName) -}}
{{- fail "certificates.mode=secret needs certificates.secretName: the existing Secret (tls.crt, tls.key) in the release namespace" -}}
{{- end -}}
{{- end -}}

{{/*
Labels of the hook pods and objects (helm test, post-delete cleanup): the release's labels with a
component, but without app.kubernetes.io/name, so that neither the Service, the
PodDisruptionBudget nor the cleanup's wait for the webhook's pods selects them.
*/}}
{{- define "svw.hookLabels" -}}
{{- $ctx := index . 0 -}}
helm.sh/chart: {{ printf "%s-%s" $ctx.Chart.Name $ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/part-of: {{ include "svw.name" $ctx }}
app.kubernetes.io/component: {{ index . 1 }}
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
{{- end -}}

{{- define "svw.testName" -}}
{{- printf "%s-test" (include "svw.fullname" .) -}}
{{- end -}}

{{- define "svw.cleanupName" -}}
{{- printf "%s-cleanup" (include "svw.fullname" .) -}}
{{- end -}}

{{/*
The parts of a hook pod's spec it shares with the webhook's pods: pull secrets, the hardened
pod security context, and where it may run.
*/}}
{{- define "svw.hookPodSpec" -}}
automountServiceAccountToken: true
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
