"""`attn serve`: the models of `attn` over HTTP (docs/serve-api.md).

`app` puts the server together; `routes` checks requests and shapes answers; `work` builds the jobs that `engine`
runs on each model's own thread, batched; `gate` and `access` guard the door; `errors` gives every failure one
JSON shape.
"""

from attn.app.serve.access import api_keys
from attn.app.serve.app import create_app, listen, run_server
from attn.app.serve.options import ServeOptions
from attn.app.serve.served_models import ServedModel, load_served_models

__all__ = ["ServeOptions", "ServedModel", "api_keys", "create_app", "listen", "load_served_models", "run_server"]
