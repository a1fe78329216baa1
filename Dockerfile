# notifier's image: the wheel is built in a first stage and installed in a slim runtime that
# runs as an unprivileged user. Build and run (see compose.yaml for the whole stack):
#
#   docker build -t notifier .
#   docker run --rm -v "$PWD/deploy/production.toml:/etc/notifier/notifier.toml:ro" \
#       -e NOTIFIER_DATABASE_URL=… -e NOTIFIER_BROKER_URL=… -p 8080:8080 notifier
#   docker run --rm … notifier migrate --config /etc/notifier/notifier.toml

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md schema.sql ./
COPY migrations ./migrations
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 notifier \
    && useradd --system --uid 10001 --gid notifier --home-dir /nonexistent \
        --no-create-home --shell /usr/sbin/nologin notifier
COPY --from=build /dist /tmp/dist
RUN pip install --no-cache-dir /tmp/dist/*.whl && rm -rf /tmp/dist
# numeric, so that an orchestrator can tell it is not root (runAsNonRoot)
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["notifier"]
CMD ["run", "--config", "/etc/notifier/notifier.toml"]
