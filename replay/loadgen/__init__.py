"""``replayllm loadgen``: a workload against any OpenAI-compatible server, measured on the
client (``client``: one streamed request; ``runner``: open and closed loop; ``result``: the
metric table and the Parquet file)."""
