# protoflask: gunicorn's gevent worker serving wsgi:app (config from the environment).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protoflask ./protoflask
RUN pip install --no-cache-dir .
COPY wsgi.py gunicorn.conf.py ./
# not root: a compromised worker owns nothing but its own process
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin protoflask
USER 10001
ENV HOST=0.0.0.0 PORT=8080
EXPOSE 8080
# /health is 200 while serving, 503 while draining (docs/OPERATIONS.md); no curl in the image
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '8080'), timeout=2)"]
# JWT_SECRET must be supplied at run time: docker run -e JWT_SECRET=... -p 8080:8080 protoflask
CMD ["gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"]
