# storageversion-webhook container image: a release build of the one binary on a distroless base
# (glibc, CA certificates, no shell, no package manager), run as a non-root user.
#
#   docker build -t storageversion-webhook:0.1.0 .
#
# The chart runs it as `storageversion-webhook serve ...` (the binary is the entrypoint).
# The Rust version is the one the crate is built and tested with in this repository.

ARG RUST_VERSION=1.95

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

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/storageversion-webhook /usr/local/bin/storageversion-webhook
# 65532 is distroless's "nonroot" user; the chart's securityContext uses the same numeric IDs.
USER 65532:65532
# 8443: HTTPS admission (POST /validate); 8080: admin (/livez, /readyz, /metrics).
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/storageversion-webhook"]
