# syntax=docker/dockerfile:1
# raysync's image: one static binary on distroless-static, numeric non-root user, no shell; runs with a
# read-only root filesystem (it writes nothing to disk). Build: docker build -t ghcr.io/raysync/syncer:dev .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY cmd/ cmd/
COPY internal/ internal/
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /out/syncer ./cmd/syncer

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/syncer /syncer
USER 65532:65532
ENTRYPOINT ["/syncer"]
