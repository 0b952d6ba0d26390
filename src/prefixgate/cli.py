"""``prefixgate``: one command, with subcommands. Only the table of commands lives here;
each command's body is in ``commands/`` (the lab's beside their code, in ``lab/``)."""

from __future__ import annotations

import click

from prefixgate import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="prefixgate")
def main() -> None:
    """A gateway for self-hosted LLM inference that keeps upstream prefix caches hot and
    says exactly why they are not."""


def _register_subcommands() -> None:
    # Larger commands live beside their code; they import their heavy parts lazily.
    from prefixgate.commands.doctor import doctor
    from prefixgate.commands.keys import keys
    from prefixgate.commands.reload import reload_command
    from prefixgate.commands.serve import serve
    from prefixgate.commands.usage import usage
    from prefixgate.lab.bench.command import bench_command
    from prefixgate.lab.demo import demo
    from prefixgate.lab.simulate.command import simulate_command
    from prefixgate.lab.upstream_sim.command import upstream_sim

    main.add_command(serve, "serve")
    main.add_command(upstream_sim, "upstream-sim")
    main.add_command(demo, "demo")
    main.add_command(doctor, "doctor")
    main.add_command(keys, "keys")
    main.add_command(reload_command, "reload")
    main.add_command(usage, "usage")
    main.add_command(simulate_command, "simulate")
    main.add_command(bench_command, "bench")


_register_subcommands()

if __name__ == "__main__":  # pragma: no cover
    main()
