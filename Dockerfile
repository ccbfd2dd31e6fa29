# One image for every role: the compose file and deploy/k8s run `agent-engine
# serve|worker|clock|migrate`. The slim production install: exactly the locked versions
# (requirements/app.txt, hash-checked), then the package itself (not editable) without the
# `embedded` extra -- no embedded PostgreSQL or Valkey, DATABASE_URL and REDIS_URL name real
# servers -- and the image runs as an unprivileged numeric user (Kubernetes' runAsNonRoot can check
# a numeric user). Nothing is written to the image at run time. /app/sbom.cdx.json is the image's
# software bill of materials (CycloneDX, made from the installed environment at build time).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 AGENT_ENGINE_LOG_FORMAT=json
WORKDIR /app
COPY requirements/app.txt ./requirements.txt
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir --require-hashes -r requirements.txt \
    && pip install --no-cache-dir --no-deps . \
    && python -m venv /tmp/sbom \
    && /tmp/sbom/bin/pip install --no-cache-dir --quiet cyclonedx-bom==7.5.0 \
    && /tmp/sbom/bin/cyclonedx-py environment --output-reproducible --of JSON \
         -o /app/sbom.cdx.json /usr/local/bin/python \
    && rm -rf /tmp/sbom src build pyproject.toml README.md requirements.txt \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /app agent
# `agent-engine migrate` reads the Alembic scripts from ./migrations (the working directory).
COPY migrations ./migrations
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["agent-engine"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
