"""What click knows of `once`, as roff: the commands in the page's order, each option's names,
metavar, default, range, choices and environment variables, an option's .TP entry and a
command's synopsis. Everything comes from `once.cli.main.cli`, so the page cannot disagree with
`--help`.

Imports click, the roff engine (once._docs.roff) and, when asked for the group, once.cli.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import click

from once._docs.roff import bold, esc, italic, line, macro, markup, prose

PROG = "once"

# Commands in the order a reader meets them; commands not named here follow, in the order
# once.cli.main.load_commands adds them.
COMMAND_ORDER = (
    "run",
    "catchup",
    "rerun",
    "status",
    "history",
    "logs",
    "check",
    "periods",
    "metrics",
    "serve",
    "schema",
    "prune",
    "state",
)

# Parameters of which a command needs exactly one (click has no word for it).
ONE_OF = (("every", "cron"),)


def load_cli() -> click.Group:
    """The `once` group with every command on it (cli.py alone registers only `run`)."""
    from once.cli.main import cli, load_commands

    load_commands()  # all of them, not only `run`
    return cli


def root_context(group: click.Group) -> click.Context:
    """The context `once` runs in: the group's settings (help names, env prefix) applied."""
    return click.Context(group, info_name=PROG, **group.context_settings)


@dataclass(frozen=True)
class Command:
    name: str
    command: click.Command
    ctx: click.Context

    @property
    def options(self) -> list[click.Option]:
        """The documented options, in --help order (hidden ones and --help left out)."""
        return [p for p in self.command.params if isinstance(p, click.Option) and not p.hidden]

    @property
    def arguments(self) -> list[click.Argument]:
        return [p for p in self.command.params if isinstance(p, click.Argument)]


def commands(group: click.Group) -> list[Command]:
    """Every visible command, in COMMAND_ORDER, with a context as `once NAME` would get."""
    root = root_context(group)
    names = [n for n in COMMAND_ORDER if n in group.commands]
    names += [n for n in group.commands if n not in names]
    found = []
    for name in names:
        cmd = group.commands[name]
        if cmd.hidden:
            continue
        ctx = click.Context(cmd, info_name=name, parent=root, **cmd.context_settings)
        found.append(Command(name, cmd, ctx))
    return found


def envvars(option: click.Option, ctx: click.Context) -> list[str]:
    """The variables the option reads: its own, or click's ONCE_<COMMAND>_<NAME>.

    --help and --version (options that pass no value to the command) read none worth naming.
    """
    if not option.expose_value:
        return []
    if option.envvar:
        return [option.envvar] if isinstance(option.envvar, str) else list(option.envvar)
    if option.allow_from_autoenv and ctx.auto_envvar_prefix and option.name:
        return [f"{ctx.auto_envvar_prefix}_{option.name.upper()}"]
    return []


def option_names(option: click.Option) -> list[str]:
    """Short names first, as click's --help lists them."""
    return sorted(option.opts, key=lambda opt: len(opt) - len(opt.lstrip(opt[:1])))


def metavar(option: click.Option, ctx: click.Context) -> str | None:
    if option.is_flag or option.count:
        return None
    return option.make_metavar(ctx)


def default_text(option: click.Option) -> str | None:
    """The default as --help would show it, or None when there is none worth showing."""
    if option.show_default is False:
        return None
    if isinstance(option.show_default, str):
        return option.show_default
    default = option.to_info_dict()["default"]  # click's UNSET sentinel reads as None here
    if option.is_flag and option.secondary_opts:
        return option.opts[-1] if default else option.secondary_opts[-1]
    if option.is_flag or option.count or default is None or callable(default):
        return None
    if isinstance(default, list | tuple):
        return " ".join(str(v) for v in default) if default else None
    return str(default)


def range_text(option: click.Option) -> str | None:
    kind = option.type
    if not isinstance(kind, click.IntRange | click.FloatRange) or option.count:
        return None
    low, high = kind.min, kind.max
    lo_word = "more than" if kind.min_open else "at least"
    hi_word = "less than" if kind.max_open else "at most"
    if low is not None and high is not None:
        if not kind.min_open and not kind.max_open:
            return f"From {low} to {high}."
        return f"{lo_word.capitalize()} {low} and {hi_word} {high}."
    if low is not None:
        return f"{lo_word.capitalize()} {low}."
    if high is not None:
        return f"{hi_word.capitalize()} {high}."
    return None


def choices_text(option: click.Option) -> str | None:
    if isinstance(option.type, click.Choice):
        return "One of " + ", ".join(f"`{c}`" for c in option.type.choices) + "."
    return None


def option_tag(option: click.Option, ctx: click.Context) -> str:
    """The .TP tag: bold names, italic metavar."""
    tag = ", ".join(bold(opt) for opt in option_names(option))
    if option.secondary_opts:
        tag += " / " + ", ".join(bold(opt) for opt in option.secondary_opts)
    var = metavar(option, ctx)
    if var:
        tag += " " + italic(var)
    return tag


def option_entry(option: click.Option, ctx: click.Context) -> list[str]:
    """One option as a .TP paragraph: help, then range, default and environment."""
    out = [".TP", line(option_tag(option, ctx))]
    help_text = option.help or ""
    body = prose(help_text, lead="", sep=".IP")
    facts: list[str] = []
    if option.required:
        facts.append("Required.")
    for extra in (range_text(option), choices_text(option)):
        if extra:
            facts.append(markup(extra))
    default = default_text(option)
    if default is not None and "default:" not in help_text:
        facts.append(f"Default: {bold(default)}.")
    names = [name for name in envvars(option, ctx) if name not in help_text]
    if names:
        word = "Environment" if len(names) == 1 else "Environment variables"
        facts.append(f"{word}: " + ", ".join(bold(name) for name in names) + ".")
    if option.count:
        facts.append("Repeatable.")
    if facts:
        body.append(" ".join(facts))
    return out + (body or ["\\&"])


def _one_of(cmd: Command) -> dict[str, tuple[click.Option, ...]]:
    """For each first member of an ONE_OF group the command takes whole: the group."""
    by_name = {opt.name: opt for opt in cmd.options}
    groups = {}
    for names in ONE_OF:
        if all(name in by_name for name in names):
            groups[names[0]] = tuple(by_name[name] for name in names)
    return groups


def synopsis(cmd: Command) -> list[str]:
    """`once NAME` with its required options, the ONE_OF groups, [OPTIONS] and arguments."""
    groups = _one_of(cmd)
    grouped = {opt.name for members in groups.values() for opt in members}
    pieces: list[str] = []
    optional = False
    for opt in cmd.options:
        if opt.name in groups:
            pieces.append(
                "(" + " | ".join(_usage_option(o, cmd.ctx) for o in groups[opt.name]) + ")"
            )
        elif opt.name in grouped:
            continue
        elif opt.required:
            pieces.append(_usage_option(opt, cmd.ctx))
        else:
            optional = True
    if optional:
        pieces.append("[" + italic("OPTIONS") + "]")
    for arg in cmd.arguments:
        pieces.extend(_usage_words(piece) for piece in arg.get_usage_pieces(cmd.ctx))
    return [macro("SY", f"{PROG} {cmd.name}"), *(line(p) for p in pieces), ".YS"]


def _usage_option(option: click.Option, ctx: click.Context) -> str:
    name = option_names(option)[-1]
    var = metavar(option, ctx)
    return bold(name) + ("\\ " + italic(var) if var else "")  # \\ : an unbreakable space


def _usage_words(piece: str) -> str:
    """An argument's usage piece: -- in bold, upper-case words in italics."""
    out = []
    for word in re.split(r"(\s+)", piece):
        if word == "--":
            out.append(bold(word))
        else:
            out.append(re.sub(r"[A-Z][A-Z0-9_]*", lambda m: italic(m.group(0)), esc(word)))
    return "".join(out)

