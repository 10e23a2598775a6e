# syntax=docker/dockerfile:1
# mirrorworker container image, for users with Docker or another builder.
# `make image` builds the same image without Docker and without network
# access to a registry (deploy/cmd/mkimage); see README "Deploying".
#
#   docker build -t mirrorworker:dev --build-arg VERSION=$(git describe --always) .
#   docker run --read-only -v mw-data:/var/lib/mirrorworker -p 8081:8081 mirrorworker:dev run --nats-url nats://...

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# Static: no libc in the final image. -trimpath: no build paths in the binary.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/mirrorworker ./cmd/mirrorworker
# The data directory, owned by the runtime user, for a container run without
# a volume (Kubernetes mounts one over it).
RUN mkdir -p /out/data && chown 65532:65532 /out/data

FROM scratch
# Root CAs for HTTPS origins; nothing else from the build stage.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/mirrorworker /usr/local/bin/mirrorworker
COPY --from=build --chown=65532:65532 /out/data /var/lib/mirrorworker
ARG VERSION=dev
LABEL org.opencontainers.image.title="mirrorworker" \
      org.opencontainers.image.description="Polite URL mirroring worker on NATS JetStream" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/mirrorworker/mirrorworker"
# Non-root, numeric so that runAsNonRoot can verify it. Nothing is written
# outside /var/lib/mirrorworker, so the root filesystem can be read-only.
USER 65532:65532
WORKDIR /var/lib/mirrorworker
ENV MIRRORWORKER_DATA_DIR=/var/lib/mirrorworker
# The admin endpoint: /metrics, /healthz, /readyz, /debug/pacer.
EXPOSE 8081
ENTRYPOINT ["/usr/local/bin/mirrorworker"]
CMD ["run"]
