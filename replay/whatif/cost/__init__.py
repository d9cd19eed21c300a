"""The what-if step-time model: ``features`` (a step's features and class), ``fit`` (fitting),
``model`` (``CostModel``: fit, predict, save/load) and ``explain`` (what it rests on, in words)."""
