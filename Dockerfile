# storageversion-webhook container image: the one binary, run as a non-root user (65532), with
# nothing to write (read-only root filesystem). Two variants, chosen by the BASE build argument:
#
#   BASE=static (no registry needed; what `scripts/image` builds and the tests run):
#     the context is a directory holding a static `storageversion-webhook` binary, and the
#     image is that binary on an empty `scratch` base. `scripts/image` does all of it.
#
#   BASE=distroless (default; needs registry access to docker.io and gcr.io):
#     docker build -t storageversion-webhook:0.1.0 .
#     compiles in a rust image and runs on distroless (glibc, CA certificates, no shell).
#
# The chart runs it as `storageversion-webhook serve ...` (the binary is the entrypoint).
# The Rust version is the one the crate is built and tested with in this repository.

ARG RUST_VERSION=1.95
ARG BASE=distroless

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Dependencies first, so that a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && cargo build --release --locked --bin storageversion-webhook \
 && rm -rf src
COPY src ./src
# Make cargo see the real sources as newer than the placeholder build.
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked --bin storageversion-webhook \
 && install -D -m 0755 target/release/storageversion-webhook /out/storageversion-webhook

FROM gcr.io/distroless/cc-debian12:nonroot AS base-distroless
COPY --from=build /out/storageversion-webhook /usr/local/bin/storageversion-webhook

FROM scratch AS base-static
COPY storageversion-webhook /usr/local/bin/storageversion-webhook

FROM base-${BASE}
# 65532 is distroless's "nonroot" user; the chart's securityContext uses the same numeric IDs.
USER 65532:65532
# 8443: HTTPS admission (POST /validate); 8080: admin (/livez, /readyz, /metrics).
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/storageversion-webhook"]
