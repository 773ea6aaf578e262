"""A treasury team set up through the console in a real browser (tests/browser.py), shared by the
browser tests: an admin enrols a key in the page and is approved by the bootstrap admin API key, and
their key's entry is put in CONSOLE_ADMINS (as operations would after confirming its fingerprint);
the others enrol in their own pages, the admin approves each in the Enrolments tab with a role
(signing each activation with their key), and copies each operator's approver entry from the page
(TOML) for the signer's configuration.

- `enrol_team(browser, console, origin, roles)` -> Team: people by name, the approver entries of
  the operators (parsed from the page's TOML), screenshots along the way;
- `approve_in_page(person, wid, comment)`: the Approve button, the confirmation (its facts
  returned as a dict), the comment, the authenticator's assertion; waits for the row's note.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field

from custody.console.auth import ConsoleAuth
from tests.browser import Browser, Person


@dataclass
class Team:
    people: dict[str, Person] = field(default_factory=dict)
    entries: dict[str, dict] = field(default_factory=dict)

    def __getitem__(self, who: str) -> Person:
        return self.people[who]


def enrol_team(browser: Browser, console, origin: str, roles: dict[str, str], run: str) -> Team:
    """`console`: tests.integration.console_helpers.Console (its admin API key approves the first
    admin). `roles`: who -> role, besides the admin, who is `admin`."""
    team = Team()
    admin = team.people["admin"] = browser.person(f"admin-{run}", origin)
    admin.enrol()
    admin.shot("enrolled-waiting")
    auth = ConsoleAuth(console.container.engine, console.container.settings)
    [pending] = [k for k in auth.credentials(state="pending") if k.username == admin.name]
    console.approve_enrolment(pending.id, "admin", signed=False)  # the bootstrap: an admin API key approves the first admin
    console.configure_admin(None, pending.id)  # operations put its entry in CONSOLE_ADMINS (after the fingerprint check)
    admin.sign_in()
    for who in roles:
        person = team.people[who] = browser.person(f"{who}-{run}", origin)
        person.enrol()
    admin.tab("enrolments")
    for who, role in roles.items():
        row = admin.page.locator("tr", has_text=team[who].name).filter(has_text="pending")
        row.locator("select").select_option(role)
        row.get_by_role("button", name="Approve").click()
        admin.page.locator("#confirm-ok").click()
        admin.page.locator("tr", has_text=team[who].name).filter(has_text="active").wait_for()
    admin.shot("enrolments-approved")
    for who, role in roles.items():
        if role != "operator":
            continue
        admin.page.locator("tr", has_text=team[who].name).get_by_role("button", name="Approver entry").click()
        entry = admin.page.get_by_test_id("approver-entry")
        entry.filter(has_text=team[who].name).wait_for()
        team.entries[who] = tomllib.loads(entry.inner_text())["approvers"][0]
    admin.shot("approver-entry")
    return team


def approve_in_page(person: Person, wid: int, comment: str) -> dict[str, str]:
    row = person.page.locator(f"tr[data-withdrawal='{wid}']")
    row.get_by_role("button", name="Approve").click()
    dialog = person.page.locator("#confirm")
    dialog.wait_for()
    facts = dict(zip(dialog.locator("dt").all_inner_texts(), dialog.locator("dd").all_inner_texts()))
    person.shot(f"confirm-{wid}")
    person.page.fill("#confirm-input", comment)
    person.page.click("#confirm-ok")
    person.page.get_by_test_id(f"note-w:{wid}").wait_for()
    return facts
