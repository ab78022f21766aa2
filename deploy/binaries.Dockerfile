# duet's static (musl) binaries, compiled inside the Rust image; dependencies are cached in a layer of
# their own (cargo-chef), so a source change recompiles only duet. The result is an image holding
# /out/duet and /out/duet-backend, which deploy/Dockerfile turns into duet's image (and the demo backend's):
#   docker build -f deploy/binaries.Dockerfile -t duet-binaries .
#   docker build -f deploy/Dockerfile -t duet .

FROM rust:1.89-alpine3.21 AS chef
# hadolint ignore=DL3018
RUN apk add --no-cache musl-dev && cargo install cargo-chef --locked --version 0.1.73
WORKDIR /src

FROM chef AS plan
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
COPY --from=plan /src/recipe.json recipe.json
RUN cargo chef cook --profile dist --locked --target x86_64-unknown-linux-musl --recipe-path recipe.json
COPY . .
RUN cargo build --profile dist --locked --target x86_64-unknown-linux-musl --bin duet --bin duet-backend

FROM scratch
COPY --from=build /src/target/x86_64-unknown-linux-musl/dist/duet /src/target/x86_64-unknown-linux-musl/dist/duet-backend /out/
