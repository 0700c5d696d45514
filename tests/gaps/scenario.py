"""A week of realistic traffic over a copy of the sample knowledge base with planted gaps, for ``ragloop gaps``.

The copy differs from the sample in two planted ways: ``plans-and-pricing.md`` is stale (its ``valid_until`` is
past; its owner is ``billing-team``) and a new page, ``webhook-endpoints.md``, contradicts ``webhooks.md`` on the
number of webhook endpoints (50 against 20). The traffic mixes answerable questions (some rated down) with
paraphrases of five gap topics the knowledge base does not answer, each hit by more users than any answerable
question. Everything is drawn from one seeded generator, so a scenario is the same every run.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from attrs import frozen

from ragloop.sample import sample_kb_path

#: Start of the scenario's week (2025-05-05 00:00 UTC), and its length.
START = 1_746_403_200.0
DAYS = 7


@frozen
class Planted:
    """A gap topic planted in the traffic: its key term, the cause the report must give, its paraphrases."""

    key: str
    cause: str
    questions: tuple[str, ...]
    rate_down: bool = False


PLANTED: tuple[Planted, ...] = (
    Planted(
        "zapier",
        "no_passage",
        (
            "Does Lumen integrate with Zapier?",
            "Is there a Zapier app for Lumen?",
            "How do I trigger a Zapier zap when a task is completed?",
            "Is Lumen on Zapier?",
            "Where do I find the Zapier connector?",
            "Can I connect Zapier to Lumen?",
            "Zapier integration?",
        ),
    ),
    Planted(
        "gantt",
        "no_passage",
        (
            "How do I view my project as a Gantt chart?",
            "Is there a Gantt view?",
            "Can I see tasks on a Gantt chart timeline?",
            "Does Lumen have Gantt charts?",
            "How do I export a Gantt chart?",
            "Can I draw dependencies on a Gantt chart?",
        ),
    ),
    Planted(
        "asana",
        "partial",
        (
            "Can I import my projects from Asana?",
            "Import Asana tasks into Lumen",
            "How do I move my team from Asana?",
            "How do I import from Jira and from Asana?",
            "Does the importer support Asana?",
        ),
    ),
    Planted(
        "sms",
        "partial",
        (
            "Can notifications be sent by SMS?",
            "Do you send SMS notifications?",
            "Can I get a text message (SMS) when a task is assigned?",
            "Can I get SMS notifications for mentions?",
        ),
    ),
    Planted(
        "webhook",
        "contradicting",
        (
            "How many webhook endpoints can a workspace have?",
            "How many webhook endpoints can I register?",
            "How many webhooks can a workspace have?",
            "How many webhook endpoints are allowed in a workspace?",
        ),
        rate_down=True,
    ),
)

#: Questions the knowledge base answers (most of the traffic).
ANSWERABLE: tuple[str, ...] = (
    "How much does the Business plan cost per seat?",
    "How many API requests per minute can a key make on the Team plan?",
    "How long are deleted tasks kept in the trash?",
    "How many times does Lumen retry a failed webhook delivery?",
    "What does error E1002 mean?",
    "Which release added OIDC single sign-on?",
    "What is the maximum size of a CSV import file?",
    "What does SCIM stand for?",
    "Do I need to sign a DPA, and how?",
    "Can we enforce MFA for everyone?",
    "Is Lumen HIPAA compliant?",
    "How do I rotate an API key?",
    "How do I set up SSO with Okta?",
    "Can I pay by bank transfer in euros?",
    "How do I verify webhook signatures?",
    "Which plan includes the audit log?",
    "How do I invite a guest to a project?",
    "How do I connect Lumen to Slack?",
    "How do I link GitHub pull requests to tasks?",
    "Where can I see current incidents?",
    "How do I reset two-factor authentication for a member?",
    "Can I change the time zone of my workspace?",
    "How do I export my workspace data?",
    "What uptime does the SLA guarantee on Enterprise?",
    "How do I downgrade from Business to Team?",
    "Hi there!",
)

#: The check case of the scenario: its question, the page and the phrase it pins down, and an edit that breaks it.
CASE_QUESTION = "How long are deleted tasks kept in the trash?"
CASE_SOURCE = "data-retention-and-deletion.md"
CASE_PHRASE = "trash for 30 days"
CASE_EDIT = ("go to the **trash** for **30 days**", "go to the **trash**")


def planted_kb(target: Path) -> Path:
    """A copy of the sample knowledge base at ``target`` with the stale page and the contradicting page."""
    shutil.copytree(sample_kb_path(), target)
    pricing = target / "plans-and-pricing.md"
    pricing.write_text(
        pricing.read_text(encoding="utf-8").replace(
            "title: Plans and pricing\n",
            "title: Plans and pricing\nupdated: 2019-06-01\nvalid_until: 2020-01-01\nowner: billing-team\n",
        ),
        encoding="utf-8",
    )
    (target / "webhook-endpoints.md").write_text(
        "---\ntitle: Webhook endpoints\n---\n\n# Webhook endpoints\n\n"
        "How many webhook endpoints can a workspace have? A workspace can have up to **50 webhook endpoints**. "
        "Add webhook endpoints under Settings, Webhooks; the limit of webhook endpoints per workspace is the same "
        "on every plan.\n",
        encoding="utf-8",
    )
    return target


@frozen
class Turn:
    """One turn of the traffic.

    Attributes:
        at: When (seconds since the epoch).
        user: Who asks (their principal).
        question: What.
        rate_down: Whether they rate the reply down.
        topic: The planted topic's key term, or ``""`` for an answerable question.
    """

    at: float
    user: str
    question: str
    rate_down: bool
    topic: str


def traffic(n: int = 300, *, seed: int = 24) -> list[Turn]:
    """``n`` turns over the week: 20 per planted topic from 12 users each, the rest answerable questions, each
    from at most 4 users, a few of them rated down. Ordered by time."""
    rng = random.Random(seed)
    users = [f"key:user{i:02d}" for i in range(40)]
    out: list[Turn] = []
    for planted in PLANTED:
        askers = rng.sample(users, 12)
        for i in range(20):
            question = planted.questions[i % len(planted.questions)]
            day = rng.random() ** 0.7 * DAYS  # a little more often late in the week
            out.append(Turn(START + day * 86_400, askers[i % 12], question, planted.rate_down, planted.key))
    left = n - len(out)
    pool = list(ANSWERABLE)
    for i in range(left):
        question = pool[i % len(pool)]
        askers = users[(hash_of(question) % 36) : (hash_of(question) % 36) + 4]
        down = rng.random() < 0.05
        out.append(Turn(START + rng.random() * DAYS * 86_400, rng.choice(askers), question, down, ""))
    out.sort(key=lambda t: (t.at, t.question))
    return out


def hash_of(text: str) -> int:
    """A stable small hash (Python's own is salted per process)."""
    import zlib

    return zlib.crc32(text.encode())
