"""Build the sample support-ticket database that ships with ragloop (``src/ragloop/data/tickets.sqlite``).

The tickets belong to customers of *Lumen*, the fictional product of the sample knowledge base
(``src/ragloop/data/sample_kb``); their facts (limits, error codes, prices) match the articles. The output is
deterministic: a fixed seed, a fixed base date and ``ORDER BY``-free inserts in id order, so re-running the
script reproduces the same rows. Stdlib only.

A few tickets are pinned by id so tests and examples can rely on them: #1233 and #1234 are neighbours about SSO
(an id matcher must not confuse them), and ids 1050, 1117 and 1199 are deliberately missing (deleted spam).

Usage::

    python scripts/build_sample_tickets.py [--out src/ragloop/data/tickets.sqlite] [--seed 20240101]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

FIRST_ID = 1001
LAST_ID = 1243
MISSING_IDS = frozenset({1050, 1117, 1199})
BASE_DATE = datetime(2024, 1, 2, 9, 0)
SEED = 20240101

CUSTOMERS = (
    "Acorn Logistics",
    "Bluefin Media",
    "Cedar & Finch Architects",
    "Driftwood Games",
    "Elmstead Clinic Group",
    "Foxglove Retail",
    "Granite Peak Outdoors",
    "Harbor Lane Bank",
    "Ironbark Studios",
    "Juniper Analytics",
    "Kestrel Aviation Parts",
    "Larkspur Publishing",
    "Meadowbrook Schools",
    "Nimbus Robotics",
    "Oakhaven Legal",
    "Pinecrest Energy",
    "Quarry Street Bakery",
    "Redwood Biotech",
    "Saltmarsh Shipping",
    "Thistle Design Co.",
    "Umber Coffee Roasters",
    "Vantage Point Realty",
    "Willowby Consulting",
    "Yarrow Health",
    "Zephyr Telecom",
)

# area -> list of (summary, body sentences, resolution). Bodies have 2-4 sentences; {n} is a random number.
TEMPLATES: dict[str, list[tuple[str, tuple[str, ...], str]]] = {
    "sso": [
        (
            "SAML sign-in fails with E2001 after IdP certificate rotation",
            (
                "Since this morning everyone gets E2001 when signing in through Okta.",
                "Our IdP rotated its signing certificate yesterday.",
                "Password sign-in still works for the break-glass Owner.",
            ),
            "Uploaded the new certificate as the additional certificate in Settings → Security → SSO; sign-in works.",
        ),
        (
            "SSO users see E2002 assertion expired",
            (
                "About {n} users get E2002 when they sign in with SAML.",
                "It started after we moved our ADFS server to a new host.",
            ),
            "The new ADFS host's clock was 6 minutes fast; after enabling NTP the assertions validate.",
        ),
        (
            "OIDC setup: redirect_uri mismatch in Google Workspace",
            (
                "We are switching from SAML to OIDC and Google says redirect_uri mismatch.",
                "We entered the callback URL from the help article.",
            ),
            "The redirect URI had a trailing slash; removing it fixed the error.",
        ),
        (
            "Cannot enforce SSO, button greyed out",
            (
                "The Required option for SSO is disabled in our workspace.",
                "We are on the Team plan and want to enforce SSO for {n} people.",
            ),
            "SSO needs the Business or Enterprise plan; the customer upgraded to Business and enforced SSO.",
        ),
    ],
    "scim": [
        (
            "SCIM deprovisioning does not free seats",
            (
                "We deactivated {n} users in Entra ID but our seat count did not drop.",
                "The users still show as active members in Lumen.",
            ),
            "The Entra ID app did not have 'deactivate users' enabled; after enabling it the users were suspended.",
        ),
        (
            "New hires get E2003 user not provisioned",
            (
                "New employees assigned to the Lumen app in Okta cannot sign in and see E2003.",
                "Existing users are fine.",
            ),
            "The new hires used a subsidiary email domain that was not verified; verifying the domain fixed it.",
        ),
        (
            "SCIM token lost, how to rotate",
            ("The admin who set up SCIM left and nobody has the bearer token.", "Can we see the token again?"),
            "Tokens are shown once; the customer generated a new token, updated Okta and revoked the old one.",
        ),
    ],
    "2fa": [
        (
            "Lost phone, cannot sign in with 2FA",
            ("I lost my phone and do not have my recovery codes.", "I am a Member, not an Owner."),
            "A workspace Admin reset 2FA under Settings → Members; the user set up a new authenticator.",
        ),
        (
            "2FA codes rejected with E1003",
            ("My authenticator codes are always rejected with E1003.", "I have tried several codes in a row."),
            "The phone's clock was set manually and was 2 minutes off; enabling automatic time fixed it.",
        ),
        (
            "Request SMS as a 2FA method",
            ("Some of our field staff do not have smartphones.", "Can Lumen send 2FA codes by SMS?"),
            "SMS is not supported; recommended hardware security keys (WebAuthn) for those staff.",
        ),
    ],
    "billing": [
        (
            "Invoice needs our VAT number",
            ("Our last invoice is missing our EU VAT ID.", "Finance needs it reissued for the reverse charge."),
            "Added the VAT ID to billing details and reissued the invoice, which was less than 90 days old.",
        ),
        (
            "Workspace read-only after failed payment (E6001)",
            ("Our workspace suddenly became read-only and shows E6001.", "The card on file expired last month."),
            "The customer updated the card and paid the open invoice; full access returned within minutes.",
        ),
        (
            "Refund for annual plan bought by mistake",
            ("We bought {n} annual Business seats instead of monthly Team seats.", "The charge was two weeks ago."),
            "Within the 30-day window: refunded pro rata and moved the workspace to monthly Team.",
        ),
        (
            "Change billing contact email",
            ("Invoices go to a former employee.", "We want them sent to our accounts payable address."),
            "Explained how to set the billing contact email in Settings → Billing; the customer changed it.",
        ),
    ],
    "plans": [
        (
            "Question about Business vs Enterprise pricing",
            ("We have {n} people and need SSO and an uptime SLA.", "Is Business enough or do we need Enterprise?"),
            "Business includes SSO and a 99.9% SLA; Enterprise adds data residency and 99.95%. Chosen: Business.",
        ),
        (
            "Hit the 10 member limit on Free (E6002)",
            ("We cannot invite an eleventh person; the invite shows E6002.", "Are guests counted too?"),
            "Free allows 10 members; guests do not count. Customer invited contractors as guests.",
        ),
        (
            "Non-profit discount",
            ("We are a registered charity.", "Do you offer a discount on the Team plan?"),
            "Applied the 50% non-profit discount after verifying the registration.",
        ),
    ],
    "api": [
        (
            "API returns 429 E3001 during nightly sync",
            (
                "Our nightly sync script gets HTTP 429 with E3001 after a few hundred requests.",
                "We are on the Team plan and use one key for everything.",
            ),
            "Team allows 300 requests per minute per key; the script now honours Retry-After and uses webhooks.",
        ),
        (
            "API key stopped working with E3002",
            ("A key used by our CI job returns 401 E3002 since yesterday.", "Nobody revoked it."),
            "The key reached its 365-day expiry; the customer created a new key and set a rotation reminder.",
        ),
        (
            "403 E3003 when creating tasks via API",
            ("GET requests work but POST /v1/tasks returns 403 E3003.",),
            "The key only had tasks:read; a new key with tasks:write fixed it.",
        ),
        (
            "Key revoked after pushing to GitHub",
            (
                "Our lum_live_ key stopped working and we got an email about secret scanning.",
                "The repository was made public by accident.",
            ),
            "Secret scanning revoked the key as designed; the customer rotated it and cleaned the repository history.",
        ),
    ],
    "webhooks": [
        (
            "Webhook endpoint disabled (E5001)",
            (
                "Our webhook endpoint was disabled and we missed events over the weekend.",
                "Our server was down for maintenance for about three days.",
            ),
            "After 72 hours of failures endpoints are disabled; re-enabled it and redelivered the missed events.",
        ),
        (
            "Webhook signature never matches",
            (
                "We compute HMAC-SHA256 of the body but it never matches Lumen-Signature.",
                "We use Express with the JSON body parser.",
            ),
            "The signature covers '<t>.<raw body>'; the customer switched to the raw body and included the timestamp.",
        ),
        (
            "Duplicate webhook deliveries",
            ("Some task.updated events arrive twice.", "Is this a bug?"),
            "Deliveries can rarely repeat; advised de-duplicating on the delivery id.",
        ),
    ],
    "integrations": [
        (
            "Slack notifications stopped",
            (
                "Lumen stopped posting to our #project-updates channel yesterday.",
                "Nothing changed on our side as far as we know.",
            ),
            "The Slack admin who installed the app left and the token was revoked; an Admin reconnected Slack.",
        ),
        (
            "GitHub PRs not linking to tasks",
            ("Pull requests mentioning lum-{n} are not linked.", "The GitHub App is installed on the organisation."),
            "Task keys must be in capitals (LUM-{n}); the repository was also missing from the installation.",
        ),
        (
            "GitHub Enterprise Server support",
            ("We run GitHub Enterprise Server 3.10 on premises.", "Can we connect it on the Business plan?"),
            "GitHub Enterprise Server needs the Enterprise plan because of the IP allow-list; passed to sales.",
        ),
    ],
    "import": [
        (
            "CSV import fails with E4001",
            ("Our CSV export from the old tool has {n} rows and the import fails with E4001.",),
            "The limit is 10,000 rows and 50 MB per file; the customer split the file into parts.",
        ),
        (
            "Jira import: assignees missing",
            ("After importing from Jira most tasks are Unassigned.", "The names are in a note on each task."),
            "People were not invited before the import; after inviting them, a re-run matched by email.",
        ),
        (
            "Jira token rejected E4005",
            ("The Jira importer says E4005 token rejected.", "The token works with curl."),
            "The email entered did not match the token's Atlassian account; corrected the email.",
        ),
        (
            "Import triggered hundreds of automations",
            ("A CSV import used up most of our monthly automation runs.",),
            "Imports run 'Task created' automations unless disabled in the last step; explained the option.",
        ),
    ],
    "export": [
        (
            "Workspace export taking very long",
            ("We started a full workspace export with attachments {n} hours ago.", "It is still running."),
            "Large exports with attachments can take up to 24 hours; it finished after 19 hours.",
        ),
        (
            "Export download link expired",
            ("The link in the export email says it expired.",),
            "Download links are valid for 7 days; the customer started a new export.",
        ),
    ],
    "automations": [
        (
            "Automations paused mid-month",
            ("All our automations stopped running on the {n}th.", "We are on the Team plan."),
            "The workspace hit 1,000 runs for the month; usage resets on the 1st at 00:00 UTC. Customer upgraded.",
        ),
        (
            "Automation loop prevented",
            ("The run history shows 'Loop prevented' for our status automation.",),
            "Two automations set each other's trigger field; combined them into one.",
        ),
    ],
    "notifications": [
        (
            "Not receiving email notifications",
            ("I stopped getting email notifications for mentions.", "Push notifications still work."),
            "Emails from notify@lumen.example were quarantined by the company's spam filter; allow-listed it.",
        ),
        (
            "Too many notification emails",
            ("I get an email for every comment on {n} projects.",),
            "Suggested the daily digest with mentions delivered at once.",
        ),
    ],
    "mobile": [
        (
            "Android app stuck on Syncing",
            ("The Android app has shown Syncing… for two days.", "The web app is fine."),
            "Signing out and back in resolved it; unsynced changes were kept.",
        ),
        (
            "iOS app SSO loop",
            ("Signing in with SSO on iPhone returns to the sign-in page.", "We use OIDC."),
            "The app was on version 3.1; OIDC needs 3.2.0 or later. Updating fixed it.",
        ),
    ],
    "login": [
        (
            "Account locked E1002",
            ("I am locked out with E1002 after trying old passwords.",),
            "Accounts lock for 15 minutes after 10 failed attempts; the user reset the password.",
        ),
        (
            "Password reset email never arrives",
            ("I requested a reset link three times and got nothing.",),
            "The workspace requires SSO, so there is no Lumen password; the user signed in with SSO.",
        ),
    ],
    "audit": [
        (
            "Audit log missing after downgrade",
            ("We moved from Business to Team and the audit log page is gone.",),
            "The audit log needs Business; existing entries stay exportable for 30 days after a downgrade.",
        ),
        (
            "Stream audit log to Splunk",
            ("Can we send audit events to Splunk in real time?",),
            "Streaming to a SIEM is an Enterprise feature; shared the docs and contacted the account manager.",
        ),
    ],
    "sla": [
        (
            "Service credit claim for outage",
            (
                "The API was down for about {n} minutes last month.",
                "We are on Business and would like a service credit.",
            ),
            "Measured uptime was 99.82%, below 99.9% but above 99.0%; a 10% credit was applied to the next invoice.",
        ),
    ],
    "data-retention": [
        (
            "Restore deleted project",
            ("A colleague deleted a project by accident {n} days ago.",),
            "The project was still in the trash (30 days) and was restored with its tasks.",
        ),
        (
            "Cancel workspace deletion",
            ("Our former admin started deleting the workspace.", "We need to stop it."),
            "Within the 14-day grace period; an Owner cancelled the deletion from the email link.",
        ),
    ],
    "security": [
        (
            "Request SOC 2 report",
            ("Our security team needs your SOC 2 Type II report.",),
            "Shared the report through trust.lumen.example after the NDA was signed.",
        ),
        (
            "Sign the DPA",
            ("Our legal team needs a signed Data Processing Agreement.", "We are on the Team plan."),
            "Explained the one-click DPA in Settings → Billing → Legal; the countersigned PDF was emailed.",
        ),
        (
            "Is Lumen HIPAA compliant",
            ("We are a clinic and want to track patient follow-ups.",),
            "HIPAA is not supported; advised not to store protected health information in Lumen.",
        ),
    ],
    "custom-fields": [
        (
            "Formula field option missing",
            ("We cannot find the Formula field type.",),
            "Formula fields need Business or Enterprise; the workspace was on Team.",
        ),
        (
            "Custom field limit reached",
            ("We cannot add more fields after the Jira import.",),
            "Fields created by the import count towards the 100-field Team limit; removed unused imported fields.",
        ),
    ],
}

AREAS = tuple(TEMPLATES)
PRIORITIES = ("low", "normal", "high", "urgent")

# Pinned tickets: (area, summary, body, status, priority, resolution).
PINNED: dict[int, tuple[str, str, str, str, str, str | None]] = {
    1233: (
        "sso",
        "SAML sign-in fails with E2001 after certificate rotation",
        "Since our Okta certificate rotated on Monday, all SAML sign-ins fail with E2001. "
        "The break-glass Owner can still sign in with a password. About 140 people are affected.",
        "solved",
        "urgent",
        "The new IdP certificate was uploaded as the additional certificate; SAML sign-in works again.",
    ),
    1234: (
        "sso",
        "SAML sign-in fails with E2002 for users in the Sydney office",
        "Users in our Sydney office get E2002 when signing in with SAML; other offices are fine. "
        "They go through a separate ADFS server. The problem started after daylight-saving time changed.",
        "open",
        "high",
        None,
    ),
    1235: (
        "sso",
        "OIDC enforcement question for contractors",
        "We want to require SSO but our contractors are guests without accounts in our IdP. "
        "Will enforcing SSO lock them out?",
        "pending",
        "normal",
        None,
    ),
    1042: (
        "api",
        "API rate limit on Business plan",
        "Our integration on the Business plan gets 429 responses with E3001. "
        "We send about 1,500 requests per minute with one key.",
        "solved",
        "normal",
        "Business allows 1,000 requests per minute per key; the integration now uses two keys and webhooks.",
    ),
    1100: (
        "billing",
        "Invoice #INV-2024-0311 shows the wrong company address",
        "Our March invoice shows our old address. Please reissue it with the new one.",
        "closed",
        "low",
        "Billing details updated and the invoice, issued 40 days earlier, was reissued.",
    ),
}


def _body(rng: random.Random, sentences: tuple[str, ...]) -> str:
    n = rng.choice((3, 5, 12, 25, 40, 75, 120))
    out = [s.format(n=n) for s in sentences]
    extra = (
        "Could you look into it?",
        "This is blocking our team.",
        "Thanks for your help.",
        "Happy to share screenshots.",
        "We are on the {plan} plan.",
    )
    while len(out) < 2 or (len(out) < 4 and rng.random() < 0.5):
        out.append(rng.choice(extra).format(plan=rng.choice(("Team", "Business", "Enterprise"))))
    return " ".join(out[:4])


def build(out: Path, seed: int = SEED) -> int:
    """Write the database to ``out`` (replacing it) and return the number of tickets."""
    rng = random.Random(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    con = sqlite3.connect(out)
    con.executescript(
        """
        CREATE TABLE tickets (
            id INTEGER PRIMARY KEY,
            status TEXT NOT NULL CHECK (status IN ('open', 'pending', 'solved', 'closed')),
            priority TEXT NOT NULL CHECK (priority IN ('low', 'normal', 'high', 'urgent')),
            product_area TEXT NOT NULL,
            summary TEXT NOT NULL,
            body TEXT NOT NULL,
            created TEXT NOT NULL,
            updated TEXT NOT NULL,
            customer TEXT NOT NULL,
            resolution TEXT
        );
        CREATE INDEX tickets_area ON tickets (product_area);
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        """
    )
    rows = []
    span = LAST_ID - FIRST_ID
    for tid in range(FIRST_ID, LAST_ID + 1):
        if tid in MISSING_IDS:
            continue
        # Ticket ids grow with time: spread creation over ~10 months, with jitter.
        created = BASE_DATE + timedelta(days=300 * (tid - FIRST_ID) / span, minutes=rng.randrange(0, 600))
        age = (tid - FIRST_ID) / span
        if tid in PINNED:
            area, summary, body, status, priority, resolution = PINNED[tid]
        else:
            area = rng.choice(AREAS)
            summary, sentences, resolution_text = rng.choice(TEMPLATES[area])
            body = _body(rng, sentences)
            summary = summary.format(n=rng.randrange(10, 999))
            if age < 0.8:
                status = rng.choices(("closed", "solved", "pending", "open"), (70, 20, 5, 5))[0]
            else:
                status = rng.choices(("closed", "solved", "pending", "open"), (10, 25, 30, 35))[0]
            priority = rng.choices(PRIORITIES, (20, 50, 22, 8))[0]
            resolution = resolution_text.format(n=rng.randrange(10, 999)) if status in ("solved", "closed") else None
        updated = created + timedelta(hours=rng.randrange(1, 24 * 12))
        rows.append(
            (
                tid,
                status,
                priority,
                area,
                summary,
                body,
                created.isoformat(timespec="minutes"),
                updated.isoformat(timespec="minutes"),
                rng.choice(CUSTOMERS),
                resolution,
            )
        )
    con.executemany("INSERT INTO tickets VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.executemany(
        "INSERT INTO meta VALUES (?, ?)",
        [("generator", "scripts/build_sample_tickets.py"), ("seed", str(seed)), ("product", "Lumen (fictional)")],
    )
    con.commit()
    con.execute("VACUUM")
    con.close()
    return len(rows)


def main() -> None:
    """Parse arguments and build the database."""
    default_out = Path(__file__).resolve().parents[1] / "src" / "ragloop" / "data" / "tickets.sqlite"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    count = build(args.out, args.seed)
    print(f"wrote {count} tickets to {args.out}")


if __name__ == "__main__":
    main()
