"""``replayllm loadgen``: a workload against any OpenAI-compatible server, measured on the
client (``client``: one streamed request, whatever the server answers; ``runner``: open and
closed loop; ``settings``: the checks before a run and the server's reachability;
``interrupt``: Ctrl-C keeps what completed; ``result``: the metric table and the Parquet
file)."""
