"""``replayllm serve``: an OpenAI-compatible server over the engine, recording live traffic.

``engine.server.run.serve`` starts it; ``app`` is the HTTP frontend, ``engine_loop`` the engine
thread, ``protocol`` the request checks, ``generation`` the answers, ``metrics`` /metrics.
Needs the ``serve`` extra (FastAPI, uvicorn, prometheus-client).
"""
