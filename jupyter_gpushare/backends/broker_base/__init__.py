"""What every kind's broker side builds on, and the broker's own routes too: a kind's part of
``jupyter gpushare broker`` (:mod:`.side`), the authority it holds (:mod:`.authority`), who calls
(:mod:`.identity`), the routes' base handler and body checks (:mod:`.handler`), waiting starts
nobody asks after (:mod:`.waiting`) and the broker's traits (:mod:`jupyter_gpushare.config.broker`).

It lies under the kinds' packages (``backends/local/broker/``, ``backends/kubernetes/broker/``)
and over what the kinds share, so the broker (:mod:`jupyter_gpushare.broker`) and the kinds'
sides both build on it and the broker reaches a kind's side only through the registry.
"""
