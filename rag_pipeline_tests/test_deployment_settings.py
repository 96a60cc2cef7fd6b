"""One set of settings: a command in a shell other than `make run`'s reads what `make run` set for its
processes ($RAG_HOME/run.env, written by scripts/run_env.sh), below the shell's environment and `.env`,
and gives the answer it gives inside `make run`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.components.discovery_asset import run_reading
from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.settings import load_settings

CHECKOUT = Path(__file__).resolve().parents[1]
SAMPLE_SITE = CHECKOUT / "samples" / "site"
BIN = Path(sys.executable).parent
SECRETS = {"WEBHOOK_TOKEN", "QUERY_API_TOKEN", "OPENAI_API_KEY", "CRAWLBASE_TOKEN", "DATABASE_URL",
           "DAGSTER_POSTGRES_URL", "ANSWER_API_KEY"}


def _write_run_env(home: Path, **values: str) -> Path:
    """$RAG_HOME/run.env as `make run` writes it: through scripts/run_env.sh's write_run_env."""
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ["PATH"], "RAG_HOME": str(home), **values}
    done = subprocess.run(["bash", "-c", f"set -euo pipefail; source scripts/run_env.sh; write_run_env {' '.join(values)}"],
                          cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return home / "run.env"


def _clean_shell(home: Path, **extra: str) -> dict[str, str]:
    """A new terminal: none of `make run`'s variables, only where the index is."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(home)), "RAG_HOME": str(home),
            "LANG": "C.UTF-8", **extra}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rag-pipeline"), *args], cwd="/", env=env, capture_output=True, text=True,
                          timeout=120)


def test_run_sh_records_every_variable_it_exports_and_no_secret():
    run_sh = (CHECKOUT / "scripts" / "run.sh").read_text()
    exported = set(re.findall(r"^export ([A-Z_]+)", run_sh, re.M))
    (call,) = re.findall(r"^write_run_env (.+)$", run_sh, re.M)
    recorded = set(call.split())
    assert exported and exported <= recorded
    assert recorded & SECRETS == set()


def test_a_shell_declares_the_sites_make_run_was_given_by_sites_dir(database_url, conn, tmp_path):
    """make run with SITES_DIR (and LOCATION_HOLDS) exported: run.env records them as run.sh's own
    call does, and a command in a clean shell declares the same sites as the running location."""
    from dotenv import dotenv_values

    home = tmp_path / "home"
    home.mkdir()
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "docs.yaml").write_text("attributes:\n  seeds: [https://docs.example.com/]\n")
    (call,) = re.findall(r"^write_run_env (.+)$", (CHECKOUT / "scripts" / "run.sh").read_text(), re.M)
    make_run = {"PATH": os.environ["PATH"], "RAG_HOME": str(home), "CRAWLER": "local", "SITES_DIR": str(sites),
                "LOCATION_HOLDS": "all"}
    done = subprocess.run(["bash", "-c", f"set -euo pipefail; source scripts/run_env.sh; write_run_env {call}"],
                          cwd=CHECKOUT, env=make_run, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    recorded = dotenv_values(home / "run.env")
    assert (recorded.get("SITES_DIR"), recorded.get("LOCATION_HOLDS")) == (str(sites), "all")

    shell = _clean_shell(home, DATABASE_URL=database_url)
    checked = _cli(shell, "site", "check")
    assert checked.returncode == 0 and checked.stdout == "1 site(s) OK, 1 switched off (checked), 8 labelled question(s) read\n", checked.stdout
    from rag_pipeline.core.site_spec import SiteSpec
    from rag_pipeline.store import sites as sites_store

    with conn.transaction():       # as the running location's discovery sensor records it
        sites_store.sync_declared(conn, [SiteSpec(name="docs", seeds=("https://docs.example.com/",))])
    status = _cli(shell, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert [(s["site"], s["declared"]) for s in json.loads(status.stdout)["sites"]] == [("docs", True)]


def test_values_are_written_as_they_are_read_back_and_unset_ones_left_out(tmp_path):
    odd = "http://127.0.0.1:8900/a path/it's \\ here"
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ["PATH"], "RAG_HOME": str(home), "SAMPLE_SITE_URL": odd, "CRAWLER": "local"}
    done = subprocess.run(["bash", "-c", "set -euo pipefail; source scripts/run_env.sh; "
                           "write_run_env SAMPLE_SITE_URL CRAWLER NOT_SET_HERE"],
                          cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    from dotenv import dotenv_values

    assert dotenv_values(home / "run.env") == {"SAMPLE_SITE_URL": odd, "CRAWLER": "local"}


def test_settings_read_run_env_below_the_environment_and_dot_env(tmp_path, monkeypatch):
    home = tmp_path / "home"
    _write_run_env(home, CRAWLER="local", CRAWLER_ALLOW_NETWORKS="127.0.0.0/8", WEBHOOK_PORT="8811")
    monkeypatch.setenv("RAG_HOME", str(home))
    for name in ("CRAWLER", "CRAWLER_ALLOW_NETWORKS", "WEBHOOK_PORT"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert (settings.crawler, settings.crawler_allow_networks, settings.webhook_port) == ("local", "127.0.0.0/8", 8811)

    dot_env = tmp_path / "prod.env"
    dot_env.write_text("WEBHOOK_PORT=8822\n")
    monkeypatch.setenv("RAG_ENV_FILE", str(dot_env))
    monkeypatch.setenv("CRAWLER_ALLOW_NETWORKS", "10.0.0.0/8")
    settings = load_settings({"_env_file": str(dot_env)})
    assert (settings.crawler, settings.crawler_allow_networks, settings.webhook_port) == ("local", "10.0.0.0/8", 8822)


def test_a_command_from_a_clean_shell_reads_the_sample_site_as_make_run_does(database_url, tmp_path):
    home = tmp_path / "home"
    with LoopbackSite(SAMPLE_SITE) as site:
        _write_run_env(home, CRAWLER="local", CRAWLER_ALLOW_NETWORKS="127.0.0.0/8", SAMPLE_SITE_URL=site.base_url,
                       DAGSTER_HOME=str(home / "dagster_home"))
        shell = _clean_shell(home, DATABASE_URL=database_url)

        read = _cli(shell, "site", "discover", "sample")
        assert read.returncode == 0, read.stdout + read.stderr
        assert read.stdout.startswith("sample: complete: 6 listed"), read.stdout
        shown = _cli(shell, "site", "show", "sample")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "not in this shell" not in shown.stdout and site.base_url.split("//")[1] in shown.stdout

        # The shell's own value still wins: here it lets no loopback address through.
        refused = _cli({**shell, "CRAWLER_ALLOW_NETWORKS": "10.0.0.0/8"}, "site", "discover", "sample")
    assert refused.returncode == 1
    assert "is a loopback address; set CRAWLER_ALLOW_NETWORKS to crawl it" in refused.stdout


def test_a_failed_reading_from_the_cli_does_not_pass_for_the_sensors(database_url, conn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url)
    with LoopbackSite(SAMPLE_SITE) as site:
        monkeypatch.setenv("SAMPLE_SITE_URL", site.base_url)
        from rag_pipeline.components.site_component import declared_sites
        from rag_pipeline.settings import get_settings
        from rag_pipeline.store import sites as store

        get_settings.cache_clear()
        ((spec, rules),) = [(s, r) for s, r in declared_sites() if s.name == "sample"]
        with conn.transaction():
            store.sync_declared(conn, [spec])
        assert run_reading(conn, spec, rules, get_settings(), run_id="sensor-run").complete   # the sensor's

        monkeypatch.setenv("CRAWLER_ALLOW_NETWORKS", "")   # a shell that lets no loopback address through
        get_settings.cache_clear()
        failed = CliRunner().invoke(cli, ["site", "discover", "sample"])
    assert failed.exit_code == 1, failed.output
    said = " ".join(CliRunner().invoke(cli, ["status"]).output.split())
    assert "INCOMPLETE (read by `rag-pipeline site discover`): " in said
    assert "is a loopback address; set CRAWLER_ALLOW_NETWORKS to crawl it" in said
    assert "set CRAWLER_ALLOW_NETWORKS to crawl it; last complete reading 20" in said   # the sensor's, dated
