"""Replay: a knowledge-base change measured on the questions users really asked.

``ragloop replay --turn-log URL --index kb-index/`` reads the logged turns of a period (:mod:`ragloop.turnlog`),
asks each distinct question again (with the filters, hence the tenant wall, it was logged with; offline judges
unless a model is configured) against the given knowledge base, and compares the reply with the logged turn:
``fixed``, ``broken``, ``changed`` or ``same`` (:func:`verdict` says exactly when). The same log and knowledge
base give the same report; ``--markdown`` is a pull-request comment, ``--junit`` a CI report, and the command
exits 1 when anything is ``broken``. A logged question is replayed without its conversation (the log keeps none).

::

    from ragloop.replay import replay_turns
    report = await replay_turns(ChatRAG.from_index("kb-index/"), log.turns(since, until))
    print(report.count("fixed"), report.broken)
"""

from __future__ import annotations

from ragloop.replay._compare import VERDICTS, Outcome, ReplayItem, ReplayReport, Verdict, order, verdict
from ragloop.replay._render import as_dict, junit_xml, markdown
from ragloop.replay._run import DEFAULT_LIMIT, replay_turns

__all__ = [
    "DEFAULT_LIMIT",
    "VERDICTS",
    "Outcome",
    "ReplayItem",
    "ReplayReport",
    "Verdict",
    "as_dict",
    "junit_xml",
    "markdown",
    "order",
    "replay_turns",
    "verdict",
]
