# Ferry's container image: the `ferry` binary on a small Debian base, run as non-root.
# Build: docker build -t ferry .   (every worker and the dashboard use this one image)
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# librdkafka is built from source by rdkafka-sys; OpenSSL and zlib are linked dynamically.
RUN apt-get update && apt-get install -y --no-install-recommends libssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/* \
    && cargo build --release --locked --bin ferry \
    && strip target/release/ferry

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/ferry /usr/local/bin/ferry
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/ferry"]
CMD ["--help"]
