"""A real documentation site for the benches: Salt 3008.5's own documentation, from its source
release on the package index (`bench/peers.py --docs salt`).

Salt's docs are one of the larger prose sites a package ships in its sdist: the `doc/` tree of
the release holds the topics (tutorials, the state system, cloud, development), the reference's
hand-written pages (configuration, CLI, states' and renderers' guides) and the release notes (the
newer ones in markdown), one page a file, at the URL the page has on docs.saltproject.io. Left
out: the reference pages that are only an `automodule`/`autosummary` directive (their text is the
code's docstrings, which the docs tree does not hold; the site renders them at build time), the
include fragments (`_incl/`), the release-note templates and the man pages (`man/`, troff).

reST pages become markdown as a crawler delivers them (sdist_docs.to_markdown: section titles as
`#` headings, every other line as written); markdown pages are delivered as written.

The labelled questions of `--docs salt` (salt-3008.5-questions.jsonl), a second set beside
Django's so that the search is not judged only on the site it was tuned on: each names the page
that answers it and a marker its answering passage holds (see QUESTIONS below). They were written
from the pages alone, never from what a search finds.

    .venv/bin/python bench/labelled/salt_docs.py          # fetches once, prints the corpus's figures
    .venv/bin/python bench/labelled/salt_docs.py build    # writes salt-3008.5-questions.jsonl
    .venv/bin/python bench/labelled/salt_docs.py check    # every url a page, every marker in its page
"""

from __future__ import annotations

import json
import random
import re
import sys
import tarfile
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # run as a program

from bench.labelled import django_docs  # noqa: E402
from bench.labelled.django_docs import Question  # noqa: E402
from bench.labelled.sdist_docs import _UNDERLINE, CACHE, fetch_sdist, to_markdown  # noqa: E402

RELEASE = "3008.5"
SDIST = f"salt-{RELEASE}.tar.gz"
SHA256 = "0259deafd601d783721e5aa8ed10677d8c4d6cc12f5de17499af71590d593315"
BASE_URL = "https://docs.saltproject.io/en/latest/"
HERE = Path(__file__).resolve().parent
LEFT_OUT = ("_incl/", "_templates/", "_themes/", "man/", "topics/releases/templates/")


def fetch(cache: Path = CACHE) -> Path:
    """The source release, from the package index once (pip), checked against its SHA-256."""
    return fetch_sdist("salt", RELEASE, SDIST, SHA256, cache)


def has_prose(rest: str) -> bool:
    """Whether a reST page holds text of its own: a line that is not blank, not a title or its
    adornment, and not a directive (`.. automodule::`, `.. toctree::`, a label) or its indented
    body. A page of directives only is built from elsewhere (docstrings, other pages' titles)."""
    in_directive = False
    lines = rest.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(".."):
            in_directive = True
            continue
        if in_directive and (not line.strip() or line[:1].isspace()):
            continue
        in_directive = False
        if not line.strip() or _UNDERLINE.match(line):
            continue
        if i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1]):
            continue    # a title
        return True
    return False


def docs(sdist: Path) -> dict[str, str]:
    """Relative path (e.g. `topics/tutorials/walkthrough.rst`) → its text, for the corpus's files."""
    out = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 2)
            if len(parts) < 3 or parts[1] != "doc" or not member.isfile():
                continue
            rel = parts[2]
            if not rel.endswith((".rst", ".md")) or rel.startswith(LEFT_OUT):
                continue
            text = tar.extractfile(member).read().decode("utf-8")
            if rel.endswith(".md") or has_prose(text):
                out[rel] = text
    return out


def url_of(rel: str) -> str:
    """The page's address on the site (Sphinx's HTML builder: one .html a source file)."""
    return BASE_URL + rel.rsplit(".", 1)[0] + ".html"


def corpus(sdist: Path) -> dict[str, str]:
    """URL → markdown, as the crawler would deliver each page."""
    return {url_of(rel): text if rel.endswith(".md") else to_markdown(text)
            for rel, text in sorted(docs(sdist).items())}


# --- the labelled questions -----------------------------------------------------------------------
# Written from the pages alone, never from what a search finds: each names the one page that
# answers it and a marker, a short exact substring of that page's markdown which the answering
# passage holds (an option or flag name, a version's distinctive term, a phrase of the answer).
# Kinds:
# - `option`: a configuration option of the master/minion/proxy/logging references, generated from
#   their `### ``name``` headings (plus a few hand-picked ones of the SPM and Salt Resources pages);
# - `cli`: a flag of a Salt command (ref/cli/*);
# - `release`: a fact of one release's notes;
# - `concept`: the state system, pillar, grains, targeting, reactor, salt-ssh, cloud..., in the
#   docs' own terms;
# - `natural`: asked in other words than the page's, as someone who does not know Salt would.

QUESTIONS = HERE / f"salt-{RELEASE}-questions.jsonl"

# The configuration references whose option headings become `option` questions: page → (whose
# option, how many to ask).
CONF_PAGES = {"ref/configuration/master": ("master", 25), "ref/configuration/minion": ("minion", 15),
              "ref/configuration/proxy": ("proxy", 2), "ref/configuration/logging/index": ("logging", 1)}
_OPTION_HEADING = re.compile(r"^(?:\.\. conf_\w+:: \S+\n\n)?#+ ``([\w.]+)``\n", re.MULTILINE)
_SECTION_START = re.compile(r"^(?:\.\. conf_\w+:: \S+\n\n)?#+ ", re.MULTILINE)
_OPTION_ASKED = {
    "master": ("What does the master option `{}` set?", "What is `{}` in the salt-master configuration file for?",
               "What does setting `{}` in /etc/salt/master change?",
               "What does the master config setting `{}` control?"),
    "minion": ("What does the minion option `{}` set?", "What is `{}` in the salt-minion configuration file for?",
               "What does setting `{}` in /etc/salt/minion change?",
               "What does the minion config setting `{}` control?"),
    "proxy": ("What does the proxy minion option `{}` do?", "What is `{}` in /etc/salt/proxy for?"),
    "logging": ("What does the logging option `{}` configure?",),
}

# (page, question, marker): options of pages without `conf_*` headings.
OPTION = [
    ("topics/spm/config", "Which files does SPM leave out of a package it builds, and which option sets them?",
     "spm_build_exclude"),
    ("topics/spm/config", "What does the SPM option `spm_cache_dir` hold?", "spm_cache_dir"),
    ("topics/resources/configuration", "What is the master option `resource_index_primary_slot_size` for?",
     "resource_index_primary_slot_size"),
]

CLI = [
    ("ref/cli/salt-key", "What does `salt-key --gen-keys-dir` do?", "--gen-keys-dir=GEN_KEYS_DIR"),
    ("ref/cli/salt-key", "What does `salt-key --include-all` change when accepting or rejecting keys?",
     "Include non-pending keys when accepting/rejecting"),
    ("ref/cli/salt-key", "What is the smallest key size `salt-key --keysize` will generate?", "--keysize=KEYSIZE"),
    ("ref/cli/salt-key", "What does `salt-key -F` print?", "-F, --finger-all"),
    ("ref/cli/salt-key", "Is `salt-key -L` deprecated, and what replaces it?", "-L, --list-all"),
    ("ref/cli/salt-call", "What does `salt-call --no-return-event` do?", "--no-return-event"),
    ("ref/cli/salt-call", "What extra output does `salt-call --metadata` print?", "--metadata"),
    ("ref/cli/salt-call", "How do I make `salt-call` load modules from an additional directory?",
     "-m MODULE_DIRS, --module-dirs=MODULE_DIRS"),
    ("ref/cli/salt-call", "Which minion id does `salt-call --id` override?", "--id=ID"),
    ("ref/cli/salt-call", "What does `salt-call -g` return?", "-g, --grains"),
    ("ref/cli/salt-cloud", "What does `salt-cloud --show-deploy-args` add to the returned data?",
     "--show-deploy-args"),
    ("ref/cli/salt-cloud", "What does `salt-cloud -S` print?", "-S, --select-query"),
    ("ref/cli/salt-cloud", "What does the deprecated `salt-cloud --set-password` do?",
     "--set-password=<USERNAME> <PROVIDER>"),
    ("ref/cli/salt-cloud", "Which region does `salt-cloud -L` select?", "-L LOCATION, --location=LOCATION"),
    ("ref/cli/salt", "What does `salt --subset` do?", "--subset=SUBSET"),
    ("ref/cli/salt", "What does `salt --batch-safe-limit` do?", "--batch-safe-limit=BATCH_SAFE_LIMIT"),
    ("ref/cli/salt", "Which batch size do jobs created by `--batch-safe-limit` use?",
     "--batch-safe-size=BATCH_SAFE_SIZE"),
    ("ref/cli/salt", "What does `salt --hide-timeout` show?", "--hide-timeout"),
    ("ref/cli/salt", "What does `salt --async` print instead of waiting for the job?", ".. option:: --async"),
    ("ref/cli/salt-ssh", "What does `salt-ssh --roster-file` set?", "--roster-file"),
    ("ref/cli/salt-ssh", "What does `salt-ssh -W` do on the remote system?", "-W, --rand-thin-dir"),
    ("ref/cli/salt-ssh", "How does `salt-ssh --no-host-keys` differ from `--ignore-host-keys`?",
     "Fully ignores ssh host keys"),
    ("ref/cli/salt-ssh", "What does `salt-ssh --key-deploy` attempt?", "--key-deploy"),
    ("ref/cli/salt-ssh", "What does `salt-ssh --askpass` do?", "--askpass"),
    ("ref/cli/salt-ssh", "When do I need `salt-ssh -t` (`--regen-thin`)?", "-t, --regen-thin, --thin"),
    ("ref/cli/salt-cp", "What does `salt-cp -C` change about copying files?", "-C, --chunked"),
    ("ref/cli/salt-cp", "What does `salt-cp -n` disable?", "-n, --no-compression"),
    ("ref/cli/salt-extend", "What does `salt-extend --no-merge` do?", "--no-merge"),
    ("ref/cli/salt-extend", "Which kinds of extension can `salt-extend -e` create?", "--extension, -e"),
    ("ref/cli/salt-cloud", "What does `salt-cloud -y` answer for me?", "-y, --assume-yes"),
    ("ref/cli/spm", "When should `spm --force` be used, and why carefully?", "-f, --force"),
    ("ref/cli/spm", "What does `spm local` do?", "instead of on a package in a repository"),
    ("ref/cli/salt-proxy", "Where does `salt-proxy` write its pidfile by default?", "--pid-file PIDFILE"),
]

RELEASE_NOTES = [
    ("topics/releases/3008.5", "Which version of certifi did Salt 3008.5 update to?",
     "Updated certifi to 2026.10.23"),
    ("topics/releases/3008.4",
     "Which certificate authority incident made Salt 3008.4 upgrade certifi and the packaged pip?",
     "eMudhra/emSign CA incident"),
    ("topics/releases/3008.0",
     "In which Salt release did batch mode start using a single JID for the whole batch run?",
     "Batch mode now uses a single JID"),
    ("topics/releases/3008.0", "Which Salt release removed the legacy `salt.transport.ipc` module?",
     "Removed legacy ``salt.transport.ipc`` module"),
    ("topics/releases/3008.0", "In which release was Salt's packaged Python updated from 3.10 to 3.11?",
     "Update packaged python from 3.10 to 3.11"),
    ("topics/releases/3008.2", "Which Salt release restored the reclass ext_pillar adapter?",
     "Restore the ``reclass`` ext_pillar adapter"),
    ("topics/releases/3008.3",
     "Which release notes say that upgrading a master from 3006.x or 3007.x to 3008.x needs a grains refresh on the "
     "minions?",
     "requires running ``saltutil.refresh_grains`` on minions"),
    ("topics/releases/3007.0", "In which Salt release was support for Python 3.7 dropped?",
     "Support for python 3.7 has been dropped"),
    ("topics/releases/3007.0", "Which grain added in Salt 3007.0 tells how Salt was installed?",
     "A new ``package`` grain was added in 3007.0"),
    ("topics/releases/3007.10",
     "Which release fixed the `mine.get` runner returning nothing when a mine function sets `allow_tgt`?",
     "fixes salt runner mine.get not returning value if allow_tgt"),
    ("topics/releases/3006.0",
     "Since which release do the Linux salt-master packages create a `salt` user and run the master as it?",
     "The linux Salt Master packages will now add a Salt user"),
    ("topics/releases/3006.3", "Which Salt release replaced libnacl with PyNaCl?", "Replace libnacl with PyNaCl"),
    ("topics/releases/3006.10", "In which 3006 point release was Arch Linux support dropped?",
     "Drop Arch Linux support"),
    ("topics/releases/3005", "After which release did Salt stop building Raspberry Pi packages?",
     "We will no longer build the Raspberry Pi packages"),
    ("topics/releases/3004", "Which Salt release added support for transactional systems such as MicroOS?",
     "Transactional System Support (MicroOS)"),
    ("topics/releases/3004.1", "Why can Salt 3004.1 minions not talk to masters older than 3004.1?",
     "3004.1 minions are not able to"),
    ("topics/releases/3003", "In which release did postgres_user.present gain SCRAM-SHA-256 password hashes?",
     "Support for SCRAM-SHA-256 password hashes has been added"),
    ("topics/releases/3002", "Which Salt release added the team and teamport interface types to network.managed?",
     "``teamport``"),
    ("topics/releases/3000", "Which msgpack release was Salt 3000 incompatible with?",
     "incompatible with msgpack 1.0.0rc1"),
    ("topics/releases/2019.2.0",
     "Which release made it possible to generate a Salt-SSH roster from Terraform resources?",
     "terraform-provider-salt"),
    ("topics/releases/2019.2.0", "In which release did Salt drop \"virtual package\" support for APT?",
     "Support Dropped for APT"),
    ("topics/releases/2018.3.0", "In which release was the Stormpath external authentication module removed?",
     "Stormpath External Authentication Removed"),
    ("topics/releases/2016.11.0", "Which release added state rollback using snapper?",
     "State Rollback Using Snapper"),
    ("topics/releases/2016.3.0", "Which Salt release introduced Thorium as a provisional new reactor?",
     "Thorium - Provisional New Reactor"),
    ("topics/releases/2015.5.0", "Which release removed Salt's dependency on the requests library?",
     "Removed Requests Dependency"),
    ("topics/releases/2014.7.0", "Since which release does salt-ssh no longer need sshpass?", "No More sshpass"),
    ("topics/releases/2014.1.0", "In which release was Salt Cloud merged into Salt itself?",
     "Salt Cloud Merged into Salt"),
    ("topics/releases/0.17.0", "Which Salt release introduced the Halite web GUI?",
     "The new Halite web GUI is now available on PyPI"),
    ("topics/releases/0.9.5", "In which release did Salt switch its serialization from pickle to msgpack?",
     "Pickle to msgpack"),
    ("topics/cloud/releases/0.8.7", "Which Salt Cloud release added Parallels and DigitalOcean support?",
     "Added Parallels Support"),
    ("topics/releases/saltapi/0.8.0",
     "Which salt-api release made it possible to run the REST interface under any WSGI-compliant server?",
     "Running the REST interface via any WSGI-compliant server"),
]

CONCEPT = [
    ("topics/targeting/compound",
     "In a compound target, are spaces needed around the parentheses that group matchers?",
     "spaces are required between the parentheses and targets"),
    ("ref/states/requisites",
     "How does a `watch` requisite behave when the watching state module has no mod_watch function?",
     "If ``mod_watch`` is absent"),
    ("ref/states/requisites", "Which requisite copies the arguments of another state declaration?",
     "The ``use`` requisite is used to inherit the arguments"),
    ("ref/states/extend", "What happens when one SLS file has two `extend` declarations?",
     "Second extend will overwrite the first"),
    ("ref/states/extend",
     "When extending a state from another SLS, which arguments are appended rather than overwritten?",
     "Requisites (watch and require) are appended to"),
    ("ref/states/include", "Can `exclude` be used to silence a duplicate state ID conflict?",
     "you cannot use ``exclude`` to silence a duplicate-ID"),
    ("ref/states/vars", "Which SLS template variable holds the current SLS directory with dots as separators?",
     "then `slsdotpath` is `path.to.state`"),
    ("ref/states/top", "Why can a minion whose ID contains spaces fail to match in the top file?",
     "an edge case in which a minion ID contains whitespace"),
    ("ref/states/top", "Which top file match type matches a pillar value without globbing or PCRE?", "pillar_exact"),
    ("topics/pillar/index", "What does `ignore_missing` do in a pillar top file?",
     "When the value of ``ignore_missing`` is ``True``"),
    ("topics/pillar/index",
     "Why does calling `pillar.get()` directly on the pillar variable in a template not understand the colon "
     "delimiter?",
     "does not include the extra ``:`` delimiter functionality"),
    ("topics/grains/index", "Where are static grains of a proxy minion kept?",
     "/etc/salt/proxy.d/<minion ID>/grains"),
    ("topics/mine/index", "How can a mine function be restricted so that only some minions may read its data?",
     "targeted to only be available to specific minions"),
    ("topics/mine/index", "Where does salt-ssh look for mine_functions, and in which order?",
     "mine functions in one of three places"),
    ("topics/reactor/index", "Are grains and pillar available in the Jinja context of reactor SLS files?",
     "only have access to a minimal Jinja context"),
    ("topics/event/master_events", "Why do salt-cloud events carry a `name` instead of a minion `id`?",
     "``salt-cloud`` events are fired on behalf of a VM"),
    ("topics/jobs/index", "Where does a minion keep information about the jobs it is running?",
     "Salt Minions maintain a *proc* directory"),
    ("topics/jobs/index", "What does the scheduler's `run_on_start` parameter do?",
     "``run_on_start`` parameter set to ``False``"),
    ("topics/return_codes/index", "Which retcode is set when pillar data fails to compile before a state run?",
     "**5** is set when Pillar data fails to be compiled"),
    ("topics/ssh/index", "Which targeting types does salt-ssh support?",
     "the targeting approach differs in salt-ssh"),
    ("topics/ssh/index", "How do I debug salt-ssh by running the salt-call it ships to the target myself?",
     "look for a line containing the string, ``SALT_ARGV``"),
    ("topics/ssh/roster", "What is the `ssh_pre_hook` roster option and what happens when its script fails?",
     "Introduced in the 3008 release, the `ssh_pre_hook`"),
    ("ref/file_server/environments",
     "How do I ask for a salt:// file from a particular fileserver environment in the URL itself?",
     "can specify its fileserver environment using a"),
    ("ref/renderers/index",
     "In which order are the renderers of a render pipeline such as jinja|mako|yaml evaluated?",
     "A render pipeline can be composed from other renderers"),
    ("ref/renderers/index", "Which arguments must the render function of a custom renderer accept?",
     "This function must implement three positional arguments"),
    ("topics/cloud/deploy", "Where does salt-cloud look for custom deploy scripts by default?",
     "Custom deploy scripts are picked up from"),
    ("topics/orchestrate/orchestrate_runner", "How can orchestration run on a masterless minion?",
     "To support salt orchestration on masterless minions"),
    ("topics/eauth/index", "Can the PAM external authentication module authenticate as root?",
     "The PAM module does not allow authenticating as ``root``."),
    ("topics/sdb/index", "Why must an SDB module name its setter `set_` and declare `__func_alias__`?",
     "This is because ``set`` is a Python built-in"),
    ("topics/slots/index", "Which prefix must a slot expression start with?", "The slot syntax must start with"),
    ("topics/topology/syndic", "What is the difference between the syndic's sync and cluster modes?",
     "In cluster mode, the Syndic will only synchronize"),
    ("topics/performance/worker_pools",
     "What happens if no worker pool, or more than one, declares the `*` catchall?",
     "The master refuses to start if no pool provides a catchall"),
    ("topics/tracing/index", "How does salt-ssh pass the trace context to the remote shim?",
     "propagates trace context as the ``TRACEPARENT`` environment"),
    ("topics/jinja/index", "How can I print every variable present in the current Jinja context?",
     "The ``show_full_context`` function can be used"),
    ("topics/jinja/index", "Which Jinja filter turns a string like 32GB into a number of bytes?",
     "Given a human-readable byte string (e.g. 2G, 30MB, 64KiB)"),
]

NATURAL = [
    ("topics/targeting/grains",
     "How can I run something only on the cloud instances whose tags say they belong to production?",
     "ec2_tags:environment:*production*"),
    ("topics/targeting/batch",
     "If I roll a command out to 150 servers ten at a time, does Salt wait for all ten to finish before starting "
     "the next ten?",
     "The batch system maintains a window of running minions"),
    ("topics/targeting/pillar",
     "I try to pick machines by a value in their private per-host data but nothing matches; what do I have to do on "
     "the server first?",
     "it is required to make a Pillar"),
    ("topics/targeting/compound", "How do I run a command everywhere except on one particular host?",
     "salt -C 'not web-dc1-srv' test.version"),
    ("topics/targeting/nodegroups",
     "After adding a named set of hosts to the server's config file, do I need to restart anything before I can use "
     "it?",
     "master must be restarted for those changes"),
    ("topics/targeting/globbing",
     "Why does my command with an asterisk in the host pattern misbehave unless I put quotes around it?",
     "calls that use globbing in single-quotes"),
    ("ref/states/requisites",
     "If the code deploy step has nothing new to deploy, does the step that takes the web server offline before it "
     "still run?",
     "Neither the pre-required state nor the"),
    ("ref/states/requisites", "How do I mount a fallback NFS share only if mounting the primary one fails?",
     "backup_mount"),
    ("ref/states/requisites",
     "How can a step keep running again every so often until a file shows up, giving up after a number of tries?",
     "The retry option in a state allows it to be executed"),
    ("ref/states/parallel", "What most often goes wrong when several configuration steps run at the same time?",
     "multiple package installs in parallel"),
    ("ref/states/backup_mode", "How do I put back an earlier copy of a config file that a Salt run overwrote?",
     "Restoring is easy using"),
    ("ref/states/providers",
     "On an old Arch box without systemd, how do I make one service entry use plain init scripts?",
     "revert to the default service module"),
    ("ref/states/aggregate",
     "After switching on the merging of package installs into one call, what should I do before trusting my runs "
     "again?",
     "it is enabled states should be executed using `test=True`"),
    ("ref/states/top",
     "Every git branch and tag becomes an environment, and old tags drag stale files into my full runs; why, and "
     "how do I stop it?",
     "cause defunct SLS files to be included in the highstate"),
    ("topics/pillar/index", "Two of my per-host data files define the same key; which value do the hosts get?",
     "'last one wins' manner"),
    ("topics/pillar/index",
     "I changed the private data on the server and states see the new value, but `pillar.get` on the host still "
     "returns the old one; why?",
     "Performing these actions will *not* refresh"),
    ("topics/grains/index",
     "I set the same custom host fact in /etc/salt/grains and in the agent's main config file; which one is used?",
     "are ignored if you specify the same grains"),
    ("topics/mine/index",
     "How can my load balancer's config collect the IP addresses of all web servers automatically?",
     "pulls IP addresses from all Minions"),
    ("topics/reactor/index", "How do I respond automatically to events on a machine that has no central server?",
     "the only way to run the Reactor if you use masterless"),
    ("topics/reactor/index",
     "My automatic response to an event never fires; how can I see whether the server noticed the event and what it "
     "rendered?",
     "Gathering reactors for tag foo/bar"),
    ("topics/jobs/index",
     "How do I keep a recurring task from piling up copies of itself when one run takes too long?",
     "The default for ``maxrunning`` is 1."),
    ("topics/jobs/index", "Can a recurring task run only during office hours, say from 8 AM to 5 PM?",
     "(every hour) between the hours of 8:00 AM and 5:00 PM"),
    ("topics/troubleshooting/yaml_idiosyncrasies",
     "Why does a time like 12:00 in my config turn into the number 720?",
     "is loaded by PyYAML as ``720``"),
    ("topics/troubleshooting/yaml_idiosyncrasies",
     "The word yes in my per-host data keeps turning into True; how do I keep it as text?",
     "Pillars will be parsed twice by salt"),
    ("topics/tutorials/preseed_key",
     "How can a new machine be trusted by the server before it first boots, so it configures itself right away?",
     "public key file has the same name as your minion id"),
    ("faq", "My shell command runs on every single apply even when nothing changed; why?",
     "will run the corresponding command"),
    ("faq", "Is it safe to decide which hosts get secrets from facts the hosts report about themselves?",
     "The only grain which can be safely used is ``grains['id']``"),
    ("faq", "How do I upgrade the agent through Salt itself without killing the run that does the upgrade?",
     "so the restart runs detached from the state run"),
    ("topics/troubleshooting/master", "How do I capture a performance profile of the central server process?",
     "This will activate ``yappi`` profiler"),
    ("topics/tutorials/intro_scale",
     "If a thousand agents reconnect within a 60-second window after a server restart, about how many connection "
     "attempts a second does the server see?",
     "round about 16 connection attempts a second"),
    ("topics/tutorials/intro_scale", "Why do all my machines log in again at once right after I delete one key?",
     "the minions aren't notified"),
    ("topics/ssh/index",
     "I always pass the same options to the agentless tool; can I keep them in a file in my project directory?",
     "If you are commonly passing in CLI options to"),
    ("ref/file_server/file_roots",
     "If a file is missing from my main files directory, can Salt fall back to a second one?",
     "``/srv/salt/failover/httpd/httpd.conf`` will be used"),
    ("ref/publisheracl",
     "How do I let ordinary local accounts on the server run only a few chosen commands on the fleet?",
     "to allow system users other than root"),
    ("topics/cloud/map",
     "In my cloud layout file, how do I make sure the database VM exists before the web VM is created?",
     "The ``requires`` directive can be used in map files"),
    ("topics/cloud/deploy", "How do I create cloud VMs as fast as possible, with nothing installed on them?",
     "results in a VM being spun up much faster"),
    ("topics/orchestrate/orchestrate_runner",
     "How do I count a rollout across many hosts as successful as long as at least N of them succeed?",
     "use ``allow_fail`` with N = (matched - required)"),
    ("topics/orchestrate/orchestrate_runner",
     "Can I apply a state file on the server itself without an agent installed there?",
     "would not require a minion daemon to be running"),
    ("topics/eauth/index",
     "After logging in through LDAP once, where is my temporary credential kept, and for how long is it valid?",
     "This token is stored in a file named ``salt_token``"),
    ("topics/beacons/index",
     "A watcher sends an event, the response edits the watched file, and that triggers it again; how do I break the "
     "loop?",
     "To avoid these types of scenarios"),
    ("topics/sdb/index",
     "Can I keep passwords in the operating system's keyring instead of plain text files and refer to them from "
     "config?",
     "keyring package, rather than as plain-text files"),
    ("topics/slots/index",
     "How can a step use a value that an earlier step of the same run just created, like a new group's numeric ID?",
     "group.info(\"known_users\").gid"),
    ("topics/topology/syndic",
     "Only one key shows up on my top server for a whole branch office of machines; is that expected?",
     "Only the Syndic key will be listed"),
    ("topics/hardening", "Which log line should I watch for to spot someone probing the server's internal methods?",
     "methods which are not exposed to network clients"),
    ("topics/hardening", "How do I replace the keys of one managed machine I think were stolen?",
     "salt-call saltutil.regen_keys"),
    ("topics/jinja/index",
     "A config file I manage contains consul-template's curly-brace syntax and Salt mangles it; how do I keep it "
     "literal?",
     "files that contain something like consul-template"),
    ("topics/jinja/index", "How can I find which part of my big templates is slow to render?",
     "can be wrapped in a ``profile`` block"),
    ("topics/performance/worker_pools",
     "Long configuration runs tie up all the server's workers and new machines time out logging in; can I reserve "
     "workers just for logins?",
     "guarantee ``_auth`` is never blocked"),
    ("topics/tracing/index", "If I turn on request tracing, how much bigger does each message get?",
     "grows by roughly 60 bytes"),
]


def _page_url(page: str) -> str:
    """The URL of a page named as on the site without its suffix (`ref/cli/salt-key`)."""
    return BASE_URL + page + ".html"


def option_questions(pages: dict[str, str], seed: int = 7) -> list[Question]:
    """A sample of each configuration reference's options, asked by name. An option qualifies when
    its name stands only in its own section (the `conf_*` line, the heading, its example: at most
    3 times) and on no other page (not even a release note's "added `x`"): then that section, and
    only it, answers."""
    rng = random.Random(seed)
    headed = {}
    for page in CONF_PAGES:
        for match in _OPTION_HEADING.finditer(pages[_page_url(page)]):
            headed.setdefault(match.group(1), set()).add(page)
    out = []
    for page, (whose, n) in CONF_PAGES.items():
        url = _page_url(page)
        text = pages[url]
        eligible = []
        for match in _OPTION_HEADING.finditer(text):
            name = match.group(1)
            following = _SECTION_START.search(text, match.end())
            section = text[match.start():following.start() if following else len(text)]
            if len(headed[name]) > 1 or not text.count(name) == section.count(name) <= 3:
                continue
            if not any(name in t for u, t in pages.items() if u != url):
                eligible.append(name)
        if len(eligible) < n:
            raise SystemExit(f"only {len(eligible)} {whose} options qualify, {n} wanted")
        asked = _OPTION_ASKED[whose]
        for i, name in enumerate(sorted(rng.sample(eligible, n))):
            out.append(Question(asked[i % len(asked)].format(name), url, name, "option"))
    return out


def written_questions(pages: dict[str, str]) -> list[Question]:
    """The hand-written questions, each checked against its page (it must be a page, and hold the marker)."""
    out = []
    for kind, rows in (("option", OPTION), ("cli", CLI), ("release", RELEASE_NOTES), ("concept", CONCEPT),
                       ("natural", NATURAL)):
        for page, question, marker in rows:
            url = _page_url(page)
            if url not in pages:
                raise SystemExit(f"{kind} question on {page}, which is not in the corpus")
            if marker not in pages[url]:
                raise SystemExit(f"{page} does not hold the marker {marker!r}")
            out.append(Question(question, url, marker, kind))
    return out


def build(sdist: Path) -> list[Question]:
    pages = corpus(sdist)
    return option_questions(pages) + written_questions(pages)


def load_questions(path: Path = QUESTIONS) -> list[Question]:
    return django_docs.load_questions(path)


def check(questions: list[Question], pages: dict[str, str]) -> int:
    """Prints the set's figures; 1 if a question names a page that is not in the corpus or a marker
    its page does not hold (or one that spans lines), or if a question is asked twice."""
    wrong, crowded, kinds, seen, twice = [], [], {}, set(), []
    for q in questions:
        kinds[q.kind] = kinds.get(q.kind, 0) + 1
        if q.question in seen:
            twice.append(q.question)
        seen.add(q.question)
        if q.url not in pages:
            wrong.append(f"not a page: {q.url} ({q.question})")
            continue
        count = pages[q.url].count(q.marker)
        if not count or "\n" in q.marker:
            wrong.append(f"marker {q.marker!r} is not a line of {q.url} ({q.question})")
        elif count > 3:
            crowded.append(f"{count}x {q.marker!r} in {q.url.removeprefix(BASE_URL)}")
    print(f"{len(questions)} questions on {len({q.url for q in questions})} pages: "
          + ", ".join(f"{n} {kind}" for kind, n in kinds.items()))
    print(f"urls: {sum(q.url in pages for q in questions)}/{len(questions)} are pages of the corpus; "
          f"markers: {len(questions) - len(wrong)}/{len(questions)} found in their page; "
          f"longest marker {max(len(q.marker) for q in questions)} characters")
    for line in wrong:
        print("  " + line)
    print(f"markers more than 3 times in their page: {len(crowded)}")
    for line in crowded:
        print("  " + line)
    print(f"duplicate questions: {len(twice)}")
    for question in twice:
        print(f"  asked twice: {question}")
    return 1 if wrong or twice else 0


def main() -> int:
    command = sys.argv[1:]
    if command == ["build"]:
        questions = build(fetch())
        with tempfile.NamedTemporaryFile("w", dir=HERE, delete=False) as out:
            for q in questions:
                out.write(json.dumps(asdict(q), ensure_ascii=False) + "\n")
        Path(out.name).replace(QUESTIONS)
        print(f"{len(questions)} questions in {QUESTIONS}")
        return 0
    if command == ["check"]:
        return check(load_questions(), corpus(fetch()))
    if command:
        print(__doc__)
        return 2
    pages = corpus(fetch())
    sizes = sorted(len(text) for text in pages.values())
    print(f"Salt {RELEASE} docs: {len(pages)} pages, {sum(sizes):,} characters "
          f"(median {sizes[len(sizes) // 2]:,}, max {sizes[-1]:,})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
