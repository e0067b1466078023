"""`attn serve`: the models of `attn` over HTTP (docs/serve-api.md).

`registry` names the served models and says what each can do; `schemas` holds the request and
response bodies; `engine` runs each model's work on its own thread, batched; `work` builds the
engine's jobs from the application's inference modules; `routes` checks requests, builds jobs and shapes
answers (`answers` writes the completions' shapes); `errors` gives every failure one JSON shape; `gate` limits
bodies, drains on shutdown and counts requests; `access` checks API keys and the caps on what one request may
ask for; `options` holds the server's settings; `metrics` the Prometheus metrics; `app` puts them together and
runs the server.
"""

from attn.app.serve.access import api_keys
from attn.app.serve.app import create_app, listen, run_server
from attn.app.serve.options import ServeOptions
from attn.app.serve.served_models import ServedModel, load_served_models

__all__ = ["ServeOptions", "ServedModel", "api_keys", "create_app", "listen", "load_served_models", "run_server"]
