"""How `bench` talks back when something is wrong: every user-caused error, ours or click's, is one line on
stderr and exit code 2; an old spelling of a command still works and says, once, how it is spelled now."""

from __future__ import annotations

import difflib

import click

from nlp_bench.errors import BenchError


class OneLineError(click.ClickException):
    """What every user-caused error becomes: `bench: error: ...` on stderr, exit code 2."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"bench: error: {' '.join(self.format_message().split())}", err=True)


def _one_line(exc: click.UsageError) -> click.ClickException:
    """Click's usage errors print three lines (usage, hint, error); scripts and users want one.
    A bare `bench` or `bench result` still shows its help."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        return exc
    hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return OneLineError(exc.format_message() + hint)


def os_line(exc: OSError) -> str:
    """An operating-system error as the user needs it: the path and the system's reason."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is None:
        return reason
    other = f" -> {exc.filename2}" if exc.filename2 else ""
    return f"{exc.filename}{other}: {reason}"


def _commands(group: click.Group, path: str) -> list[tuple[str, str]]:
    """(name, `bench ... name`) of every visible command under `group`, its groups' commands too."""
    found = []
    for name, command in group.commands.items():
        if command.hidden:
            continue
        found.append((name, f"{path} {name}"))
        if isinstance(command, click.Group):
            found += _commands(command, f"{path} {name}")
    return found


def _elsewhere(ctx: click.Context, word: str, close: bool) -> str:
    """Where a word that names no command of this group names one of another: `bench table` is `bench result
    table`, `bench list` is `bench system list` or `bench tag list`, and, with `close`, `bench tabel` is `bench
    result table`; '' where none is."""
    root = ctx.find_root().command
    if not isinstance(root, click.Group):
        return ""
    commands = _commands(root, "bench")
    names = {name for name, _ in commands}
    near = [word] if word in names else difflib.get_close_matches(word, names, n=2, cutoff=0.75) if close else []
    return " or ".join(dict.fromkeys(f"`{path}`" for name in near for n, path in commands if n == name))


class BenchGroup(click.Group):
    """Turns every user-caused error, ours or click's, into one line on stderr and exit code 2; a word that
    names no command here is answered with the closest of this group's, else with the command of another
    group it names (`bench table`: did you mean `bench result table`?)."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        word = args[0] if args else ""
        if word and not word.startswith("-") and self.get_command(ctx, word) is None:
            # a command of that very name elsewhere first, then click's closest of this group's, then elsewhere's
            where = _elsewhere(ctx, word, close=not difflib.get_close_matches(word, self.commands))
            if where:
                raise click.UsageError(f"No such command {word!r}; did you mean {where}?", ctx)
        return super().resolve_command(ctx, args)

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BenchError as exc:
            raise OneLineError(str(exc)) from None
        except click.UsageError as exc:
            raise _one_line(exc) from None
        except OSError as exc:  # a full disk, a read-only folder, a path that is not a folder: the user can act
            raise OneLineError(os_line(exc)) from None


class DefaultGroup(BenchGroup):
    """A group of modes whose first word names one of its commands or, where it names none, is read by the
    default command: `bench plan --tag 175` is `bench plan rank --tag 175`."""

    def __init__(self, *args, default: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.default = default

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ctx.help_option_names):
            args = [self.default, *args]
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The group's options and commands, then the default command's options: they are what the group's
        own word takes (`bench plan --help` lists `bench plan --tag`)."""
        super().format_options(ctx, formatter)
        command = self.commands.get(self.default)
        if command is None:
            return
        own = click.Context(command, info_name=self.default, parent=ctx)
        rows = [row for param in command.params if isinstance(param, click.Option)
                and (row := param.get_help_record(own)) is not None]
        if rows:
            with formatter.section(f"Options without a command (those of `{ctx.command_path} {self.default}`)"):
                formatter.write_dl(rows)


def renamed(old: str, new: str) -> None:
    """An old spelling was used: it still works; say how it is spelled now."""
    click.echo(f"bench: note: `{old}` is now spelled `{new}`", err=True)
