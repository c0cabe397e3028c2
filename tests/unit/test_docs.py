"""The man page and the shell completions are generated from the click definitions and kept
current: a change to cli.py that they do not reflect fails here with "run make man
completions"."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from once._docs.completions import SHELLS, completion_scripts, write_completions
from once._docs.environment import CHILD_ENV, ENV_FIXED
from once._docs.man import man_page
from once._docs.options import envvars, root_context
from once._docs.prose import example_commands
from once.cli.complete import history_names, job_names, job_or_lead_names, lead_names
from once.cli.main import cli, load_commands

load_commands()  # every command, not only `run`

ROOT = Path(__file__).resolve().parents[2]
MAN = ROOT / "man" / "once.1"
COMPLETIONS = ROOT / "completions"
STALE = "run make man completions"

# Requests the generator may write; any other line starting with a dot is a roff accident.
REQUESTS = {
    "nh",
    "TH",
    "SH",
    "SS",
    "PP",
    "TP",
    "IP",
    "SY",
    "YS",
    "EX",
    "EE",
    "RS",
    "RE",
    "nf",
    "fi",
}


def roff(text: str) -> str:
    """How an option name or variable is spelt in the page's source."""
    return text.replace("\\", "\\e").replace("-", "\\-")


def read_page() -> str:
    """man/once.1 without the no-hyphenation marks (\\%) that may precede a word."""
    return MAN.read_text(encoding="utf-8").replace("\\%", "")


def visible_commands() -> dict[str, click.Command]:
    return {name: cmd for name, cmd in cli.commands.items() if not cmd.hidden}


def visible_options(cmd: click.Command) -> list[click.Option]:
    return [p for p in cmd.params if isinstance(p, click.Option) and not p.hidden]


def section(page: str, name: str) -> str:
    """The roff source of `once NAME`'s section under COMMANDS."""
    commands = page.split("\n.SH COMMANDS\n", 1)[1].split("\n.SH ", 1)[0]
    match = re.search(rf'^\.SS "once {re.escape(name)}"\n(.*?)(?=^\.SS |\Z)', commands, re.S | re.M)
    assert match, f"once {name} has no section under COMMANDS in man/once.1: {STALE}"
    return match.group(1)


# -- current ---------------------------------------------------------------------------------


def test_man_page_is_current() -> None:
    assert MAN.exists(), f"man/once.1 is missing: {STALE}"
    assert MAN.read_text(encoding="utf-8") == man_page(), (
        f"man/once.1 differs from what the click definitions make now: {STALE}"
    )


@pytest.mark.parametrize("filename", [name for name, _ in SHELLS])
def test_completion_script_is_current(filename: str) -> None:
    path = COMPLETIONS / filename
    assert path.exists(), f"completions/{filename} is missing: {STALE}"
    assert path.read_text(encoding="utf-8") == completion_scripts()[filename], (
        f"completions/{filename} differs from what click makes now: {STALE}"
    )


def test_generation_is_deterministic(tmp_path: Path) -> None:
    assert man_page() == man_page()
    written = write_completions(tmp_path / "out")
    assert sorted(p.name for p in written) == sorted(name for name, _ in SHELLS)
    assert completion_scripts() == {p.name: p.read_text() for p in written}


# -- complete --------------------------------------------------------------------------------


def test_every_command_has_a_synopsis_and_a_section() -> None:
    page = read_page()
    synopsis = page.split("\n.SH SYNOPSIS\n", 1)[1].split("\n.SH ", 1)[0]
    for name, cmd in visible_commands().items():
        assert f'.SY "once {name}"' in synopsis, f"once {name} is not in SYNOPSIS: {STALE}"
        text = section(page, name)
        first = (cmd.help or "").split("\f")[0].strip().split("\n")[0].strip()
        words = [w for w in re.split(r"\W+", first) if len(w) > 3][:4]
        for word in words:  # its help text is there, give or take roff
            assert word in text, f"once {name}'s help is not in its section: {STALE}"


def test_every_option_of_every_command_is_documented() -> None:
    page = read_page()
    options = page.split("\n.SH OPTIONS\n", 1)[1].split("\n.SH ", 1)[0]
    for name, cmd in visible_commands().items():
        text = section(page, name)
        for opt in visible_options(cmd):
            names = [*opt.opts, *opt.secondary_opts]
            assert any(f"\\fB{roff(o)}\\fR" in text for o in names), (
                f"once {name} {names[-1]} is not in its section of man/once.1: {STALE}"
            )
            for o in names:  # every spelling, in the section or under OPTIONS
                assert roff(o) in text or f"\\fB{roff(o)}\\fR" in options, (
                    f"once {name} {o} is not in man/once.1: {STALE}"
                )
            if opt.help:
                first = opt.help.split()[0]
                assert roff(first) in text or roff(first) in options, (
                    f"the help of once {name} {names[-1]} is not in man/once.1: {STALE}"
                )
    for opt in visible_options(cli):
        for o in opt.opts:
            assert f"\\fB{roff(o)}\\fR" in options, f"once {o} is not under OPTIONS: {STALE}"


def test_every_variable_an_option_reads_is_named() -> None:
    page = read_page()
    root = root_context(cli)
    for name, cmd in visible_commands().items():
        ctx = click.Context(cmd, info_name=name, parent=root, **cmd.context_settings)
        for opt in visible_options(cmd):
            for var in envvars(opt, ctx):
                assert roff(var) in page, f"{var} (once {name}) is not in man/once.1: {STALE}"


def test_every_variable_the_page_names_exists() -> None:
    """A variable in the prose that no option reads any more (or never did) is a stale page."""
    page = read_page()
    root = root_context(cli)
    known = {name for name, _ in CHILD_ENV} | {name for name, _ in ENV_FIXED}
    for name, cmd in visible_commands().items():
        ctx = click.Context(cmd, info_name=name, parent=root, **cmd.context_settings)
        for opt in visible_options(cmd):
            known.update(envvars(opt, ctx))
    named = set(re.findall(r"(?<![A-Z_])ONCE_[A-Z][A-Z_]*", page))
    assert named <= known, f"man/once.1 names variables nothing reads: {sorted(named - known)}"


def test_fixed_sections_are_there() -> None:
    page = read_page()
    for title in (
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "COMMANDS",
        "EXIT STATUS",
        "ENVIRONMENT",
        "FILES",
        "EXAMPLES",
        "SEE ALSO",
    ):
        assert re.search(rf'^\.SH "?{title}"?$', page, re.M), title
    for var in (
        "ONCE_DATABASE_URL",
        "ONCE_TZ",
        "ONCE_NAMESPACE",
        "ONCE_OWNER",
        "ONCE_DB_PASSWORD_FILE",
        "XDG_STATE_HOME",
        "ONCE_JOB",
        "ONCE_PERIOD",
        "ONCE_PERIOD_START",
        "ONCE_PERIOD_END",
        "ONCE_ATTEMPT",
        "ONCE_FENCE",
    ):
        assert f"\\fB{roff(var)}\\fR" in page, var
    exit_status = page.split('\n.SH "EXIT STATUS"\n', 1)[1].split("\n.SH ", 1)[0]
    for status in ("0", "1", "2", "69", "70", "75", "124"):
        assert f"\\fB{status}\\fR" in exit_status, status
    for ref in ("cron", "crontab", "flock", "systemd.timer"):
        assert f"\\fB{ref}\\fR(" in page, ref


def test_the_page_is_clean_roff() -> None:
    page = read_page()
    assert page.isascii(), "non-ASCII text must be written as \\[uXXXX]"
    assert f'"once {_version()}"' in page.splitlines()[2]
    literal = False  # in .EX/.nf, leading spaces are meant
    for n, text in enumerate(page.splitlines(), 1):
        if text.startswith('.\\"'):
            continue
        if text.startswith("."):
            request = text[1:].split(" ")[0]
            assert request in REQUESTS, f"line {n}: unexpected request {text!r}"
            literal = request in ("EX", "nf") or (literal and request not in ("EE", "fi"))
        assert not text.startswith("'"), f"line {n} starts with an apostrophe"
        assert literal or not text.startswith(" "), f"line {n} starts with a space"
        assert text, f"line {n} is empty"
        assert not re.search(r"(?<!\\)-", text), f"line {n}: a hyphen not written as \\-"


def _version() -> str:
    from once import __version__

    return __version__


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_man_renders_without_warnings() -> None:
    env = {**os.environ, "MANWIDTH": "80", "MANPAGER": "cat", "PAGER": "cat", "LC_ALL": "C.UTF-8"}
    done = subprocess.run(
        ["man", "--warnings", "-l", str(MAN)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", f"man --warnings -l man/once.1 warned:\n{done.stderr}"
    for name in visible_commands():
        assert f"once {name}" in done.stdout


def test_the_docs_pages_mention_every_command() -> None:
    """The hand-written pages of docs/ (the README's sections moved there), not only the
    generated reference, say what each command is for."""
    generated = ROOT / "docs" / "reference"
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md")
                      if p.parent != generated or p.name == "run.md")
    missing = [f"once {name}" for name in visible_commands() if f"once {name}" not in pages]
    assert not missing, f"docs/ does not mention {', '.join(missing)}"


# -- examples --------------------------------------------------------------------------------


def test_examples_parse_against_the_cli() -> None:
    root = root_context(cli)
    found = list(example_commands())
    assert {argv[0] for argv in found} >= {"run", "catchup", "check"}
    for argv in found:
        cmd = cli.commands.get(argv[0])
        assert cmd is not None, f"an example runs an unknown command: once {' '.join(argv)}"
        with cmd.make_context(argv[0], argv[1:], parent=root):
            pass  # parsing and conversion passed: the options exist and their values are good


# -- job names -------------------------------------------------------------------------------


def _ctx(**params: object) -> click.Context:
    ctx = click.Context(cli.commands["run"], info_name="run", resilient_parsing=True)
    ctx.params.update(params)
    return ctx


def _run(url: str, job: str, tmp_path: Path, namespace: str | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    args = [sys.executable, "-m", "once", "run", "--db", url, "--job", job, "--every", "day"]
    if namespace:
        args += ["--namespace", namespace]
    done = subprocess.run(
        [*args, "--", "true"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_job_names_complete_from_a_sqlite_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    for job in ("nightly", "hourly", "night-owl"):
        _run(url, job, tmp_path)
    _run(url, "nightly", tmp_path, namespace="team")
    monkeypatch.delenv("ONCE_DATABASE_URL", raising=False)
    monkeypatch.delenv("ONCE_NAMESPACE", raising=False)
    param = cli.commands["run"].params[0]

    assert job_names(_ctx(db=url), param, "nigh") == ["night-owl", "nightly"]
    assert job_names(_ctx(db=url), param, "") == ["hourly", "night-owl", "nightly", "team:nightly"]
    assert job_names(_ctx(db=url, namespace="team"), param, "") == ["nightly"]
    monkeypatch.setenv("ONCE_DATABASE_URL", url)
    assert job_names(_ctx(), param, "h") == ["hourly"]


def test_lead_names_complete_where_a_lead_name_is_expected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from once.ledger import open_ledger, parse_url
    from once.ledger.leases import Leases

    url = f"sqlite:///{tmp_path}/ledger.db"
    monkeypatch.delenv("ONCE_DATABASE_URL", raising=False)
    monkeypatch.delenv("ONCE_NAMESPACE", raising=False)
    param = cli.commands["status"].params[0]
    # No `once lead` yet, no lease tables: the jobs are offered all the same.
    _run(url, "nightly", tmp_path)
    assert job_or_lead_names(_ctx(db=url), param, "nigh") == ["nightly"]
    assert lead_names(_ctx(db=url), param, "") == []
    with open_ledger(parse_url(url)) as ledger:
        leases = Leases(ledger)
        for name in ("night-shift", "team:beat", "gone"):
            term, _ = leases.acquire(name, "h", "pod", 60.0)
            assert leases.release(name, "h", term)
        assert leases.retire("gone")  # its terms stay: history and once lead offer it

    assert lead_names(_ctx(db=url), param, "") == ["gone", "night-shift", "team:beat"]
    assert lead_names(_ctx(db=url, namespace="team"), param, "") == ["beat"]
    assert job_or_lead_names(_ctx(db=url), param, "nigh") == ["night-shift", "nightly"]
    assert job_or_lead_names(_ctx(db=url), param, "g") == []  # status and check know it not
    assert job_or_lead_names(_ctx(db=url, leads=True), param, "") == ["night-shift",
                                                                       "team:beat"]
    assert job_or_lead_names(_ctx(db=url, jobs=("nightly",)), param, "nigh") == [
        "night-shift"]
    assert history_names(_ctx(db=url), param, "") == ["gone", "night-shift", "nightly",
                                                      "team:beat"]
    assert history_names(_ctx(db=url, lead=True), param, "n") == ["night-shift"]


def test_job_names_fail_silently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONCE_DATABASE_URL", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    param = cli.commands["run"].params[0]
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 100)
    empty = tmp_path / "empty.db"
    empty.touch()

    assert job_names(_ctx(), param, "") == []  # the default ledger does not exist...
    assert not (tmp_path / "state").exists()  # ...and completing does not create it
    for url in (
        f"sqlite:///{garbage}",
        f"sqlite:///{empty}",
        "postgresql://nobody@nowhere/x",
        "nonsense",
        f"sqlite:///{tmp_path}/missing/ledger.db",
    ):
        assert job_names(_ctx(db=url), param, "") == [], url


def test_the_lock_wait_the_pages_name_is_the_codes() -> None:
    # The exit statuses, `once check`'s help and the monitoring page name the reports' (and
    # prune's, schema's) bound on a table's lock in words: the same number as the code's.
    from once.ledger.records import LOCK_WAIT

    said = f"{LOCK_WAIT:g}"
    root = Path(__file__).resolve().parents[2]
    pages = (root / "docs/reference/exit-status.md").read_text() \
        + (root / "docs/how-to/monitoring.md").read_text()
    assert len(re.findall(rf"for longer than {said} s|waited for {said} s at most", pages)) == 3
    check = load_commands()["check"]
    assert f"locked past {said}s" in " ".join((check.help or "").split())
