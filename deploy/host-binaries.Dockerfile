# duet's static (musl) binaries compiled on the host, as the same kind of image that
# deploy/binaries.Dockerfile builds inside Docker: for machines with no registry to pull the Rust image
# from (CI here). Then deploy/Dockerfile makes duet's image from it, exactly as from the other.
#   rustup target add x86_64-unknown-linux-musl      # and musl-tools (musl-gcc) on Debian
#   cargo build --profile dist --locked --target x86_64-unknown-linux-musl --bin duet --bin duet-backend
#   docker build -f deploy/host-binaries.Dockerfile -t duet-binaries .
#   docker build -f deploy/Dockerfile -t duet .

FROM scratch
COPY target/x86_64-unknown-linux-musl/dist/duet target/x86_64-unknown-linux-musl/dist/duet-backend /out/
