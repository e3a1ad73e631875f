"""A tiny Ray Serve application for raysync's real-Ray tests: it says which cluster answers."""

import os

from ray import serve


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Hello:
    def __call__(self, request):
        return "hello from " + (os.environ.get("SERVE_COLOR") or os.environ.get("RAY_CLUSTER_NAME") or "nowhere")


app = Hello.bind()
