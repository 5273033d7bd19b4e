# Stands in for the registry's redis:7.0 where no registry answers: Debian's
# redis-server (7.0) on the offline base. The build reaches Debian's mirror
# through the host's network (docker build --network host).
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* && mkdir -p /data
WORKDIR /data
VOLUME /data
CMD ["redis-server", "--bind", "127.0.0.1"]
