"""What the inference engines (vLLM, SGLang) say and do, apart from the HTTP that reaches
them (:mod:`prefixgate.upstream`): their error texts and the counts behind them
(:mod:`.errors`), how their chat templates order a conversation (:mod:`.rendering`, the
facts; :mod:`.order`, learned per channel)."""
