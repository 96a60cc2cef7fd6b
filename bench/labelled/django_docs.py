"""The labelled set of bench/search_modes.py: Django 5.2.19's own documentation (the text docs of
its source release on the package index) and questions whose answering passages are known.

The corpus: `docs/ref`, `docs/topics`, `docs/howto` and the 5.1 and 5.2 release notes, one page a
file, at the URL the documentation has on docs.djangoproject.com. The docs are reStructuredText;
a crawler delivers the HTML pages as markdown, where headings are `#` lines, so section titles
(a line underlined, or over- and underlined) become `#` headings by reST's rule (levels in order
of first use). Everything else is delivered as written.

Each question names its page and a marker: a passage answers it when it is on that page and its
embedded text (section path, overlap and content) holds the marker. Kinds:
- `check`: "What does the system check admin.E108 report?" (error codes);
- `setting`: "What is the DATA_UPLOAD_MAX_MEMORY_SIZE setting for?" (exact names);
- `command`: "What does django-admin sqlflush do?" (command names);
- `release`: "What did Django 5.2.3 fix?" (version numbers);
- `natural`: questions written in other words than the page's, about a section (by its title).

    .venv/bin/python bench/labelled/django_docs.py build   # writes django-5.2.19-questions.jsonl
"""

from __future__ import annotations

import json
import random
import re
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # run as a program

from bench.labelled.sdist_docs import CACHE, fetch_sdist, to_markdown  # noqa: E402

RELEASE = "5.2.19"
SDIST = f"django-{RELEASE}.tar.gz"
SHA256 = "ad03d8abc51dbff95ebf34b27123cf0c26a3b62db7ba0cd520783686362533d1"
BASE_URL = "https://docs.djangoproject.com/en/5.2/"
HERE = Path(__file__).resolve().parent
QUESTIONS = HERE / f"django-{RELEASE}-questions.jsonl"

SECTIONS = ("ref/", "topics/", "howto/")
RELEASES = re.compile(r"^releases/5\.[12](\.\d+)?\.txt$")


@dataclass(frozen=True)
class Question:
    question: str
    url: str            # the answering page (as delivered)
    marker: str         # held by the embedded text of every passage that answers it
    kind: str


def fetch(cache: Path = CACHE) -> Path:
    """The source release, from the package index once (pip), checked against its SHA-256."""
    return fetch_sdist("django", RELEASE, SDIST, SHA256, cache)


def docs(sdist: Path) -> dict[str, str]:
    """Relative path (e.g. `ref/settings.txt`) → reST text, for the corpus's files."""
    out = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            rel = member.name.split("/docs/", 1)[1] if "/docs/" in member.name else None
            if rel and member.isfile() and rel.endswith(".txt") and (rel.startswith(SECTIONS) or RELEASES.match(rel)):
                out[rel] = tar.extractfile(member).read().decode("utf-8")
    return out


def url_of(rel: str) -> str:
    path = rel.removesuffix(".txt").removesuffix("index")
    return BASE_URL + (path if path.endswith("/") or not path else path + "/")


def corpus(sdist: Path) -> dict[str, str]:
    """URL → markdown, as the crawler would deliver each page."""
    return {url_of(rel): to_markdown(text) for rel, text in sorted(docs(sdist).items())}


def _plain(text: str) -> str:
    return " ".join(text.split())


_MARKUP = re.compile(r"[`*:|<>\[\]\\]")


def _first_words(paragraph: str, n: int = 8) -> str | None:
    """The paragraph's first n words, if they hold no markup (they must read the same in a chunk)."""
    words = paragraph.split()[:n]
    if len(words) < 5 or any(_MARKUP.search(w) for w in words):
        return None
    return " ".join(words)


def _paragraph_after(text: str, start: int) -> str:
    rest = text[start:].lstrip("\n")
    return rest.split("\n\n", 1)[0]


def check_questions(files: dict[str, str]) -> list[Question]:
    text = files["ref/checks.txt"]
    codes = sorted(set(re.findall(r"^\* \*\*([a-z_.]+\.[EWC]\d{3})\*\*:", text, re.MULTILINE)))
    return [Question(f"What does the system check {code} report?", url_of("ref/checks.txt"), code, "check")
            for code in codes]


def _described(files: dict[str, str], rel: str, pattern: str, question: str, kind: str) -> list[Question]:
    """A question for each entry ``pattern`` finds (group 1: its name) whose description opens
    with words that hold no markup and stand once on the page: they are the marker."""
    text = files[rel]
    out = []
    for match in re.finditer(pattern, text, re.MULTILINE):
        marker = _first_words(_paragraph_after(text, match.end()))
        if marker and _plain(text).count(marker) == 1:
            out.append(Question(question.format(match.group(1)), url_of(rel), marker, kind))
    return out


def setting_questions(files: dict[str, str]) -> list[Question]:
    return _described(files, "ref/settings.txt",
                      r"^\.\. setting:: ([A-Z_0-9]+)\n\n``\1``\n[-^~=]+\n\nDefault: [^\n]*(?:\n[^\n]+)*\n\n",
                      "What is the {} setting for?", "setting")


def command_questions(files: dict[str, str]) -> list[Question]:
    return _described(files, "ref/django-admin.txt", r"^\.\. django-admin:: (\w+)[^\n]*\n\n",
                      "What does django-admin {} do?", "command")


def release_questions(files: dict[str, str]) -> list[Question]:
    out = []
    for rel, text in files.items():
        version = re.match(r"releases/(5\.[12]\.\d+)\.txt$", rel)
        if version and f"Django {version.group(1)} fixes" in _plain(text):
            out.append(Question(f"What did Django {version.group(1)} fix?", url_of(rel),
                                f"Django {version.group(1)} fixes", "release"))
    return out


# Asked in other words than the section's; the marker is the section's title.
NATURAL = [
    ("topics/cache.txt", "How can I keep the output of one slow view around so it is not computed on every request?", "The per-view cache"),
    ("topics/cache.txt", "Which cache should I use while developing if I do not want anything cached?", "Dummy caching (for development)"),
    ("topics/cache.txt", "Can I keep cached data in a table of my SQL database?", "Database caching"),
    ("topics/cache.txt", "How do I use a memcached server with Django?", "Memcached"),
    ("topics/db/queries.txt", "How do I remove rows from the database with the ORM?", "Deleting objects"),
    ("topics/db/queries.txt", "How do I write an edited model instance back to the database?", "Saving changes to objects"),
    ("topics/db/queries.txt", "When are querysets actually run against the database?", "``QuerySet``\\s are lazy"),
    ("topics/db/queries.txt", "How do I take only the first few results of a query, like SQL LIMIT and OFFSET?", "Limiting ``QuerySet``\\s"),
    ("topics/db/queries.txt", "How can I copy a model instance into a new row?", "Copying model instances"),
    ("topics/db/queries.txt", "How do I compare a field with another field of the same model in a query?", "Filters can reference fields on the model"),
    ("topics/db/transactions.txt", "How do I make a block of database operations all succeed or all fail together?", "Controlling transactions explicitly"),
    ("topics/db/transactions.txt", "How do I run code only once the current transaction has committed?", "Performing actions after commit"),
    ("topics/db/multi-db.txt", "How do I send reads to a replica and writes to the primary database?", "An example"),
    ("topics/db/models.txt", "How can several models share common fields without a table of their own?", "Abstract base classes"),
    ("topics/db/models.txt", "How do I change a model's Python behaviour without changing its table?", "Proxy models"),
    ("topics/db/optimization.txt", "How do I avoid a query per row when I access a related object in a loop?", "Retrieve everything at once if you know you will need it"),
    ("topics/db/optimization.txt", "Should I compute totals in Python or let the database do it?", "Do database work in the database rather than in Python"),
    ("topics/db/aggregation.txt", "How do I compute an average or a sum over a queryset?", "Generating aggregates over a ``QuerySet``"),
    ("topics/migrations.txt", "How do I tell Django that one migration must run after another app's migration?", "Dependencies"),
    ("topics/migrations.txt", "How do I fold many old migrations into a few?", "Squashing migrations"),
    ("topics/migrations.txt", "How do I undo the migrations I applied?", "Reversing migrations"),
    ("topics/http/sessions.txt", "Where can Django keep session data besides the database?", "Configuring the session engine"),
    ("topics/http/sessions.txt", "How do I store session data signed in the browser cookie itself?", "Using cookie-based sessions"),
    ("topics/http/file-uploads.txt", "How do I handle a file a user submits through a form?", "Basic file uploads"),
    ("topics/http/middleware.txt", "How do I write my own hook that runs on every request and response?", "Writing your own middleware"),
    ("topics/http/shortcuts.txt", "Which helper sends the browser to another URL?", "``redirect()``"),
    ("topics/email.txt", "How do I see the emails my app sends during development without sending them?", "Configuring email for development"),
    ("topics/email.txt", "How do I send an email with both an HTML and a plain text version?", "Sending alternative content types"),
    ("topics/email.txt", "How can tests capture the email the code sends?", "In-memory backend"),
    ("topics/logging.txt", "How do I set up where log messages go and at which level?", "Configuring logging"),
    ("topics/auth/passwords.txt", "How does Django keep user passwords, and which hashing does it use?", "How Django stores passwords"),
    ("topics/auth/customizing.txt", "How do I use my own user model instead of the default one?", "Substituting a custom ``User`` model"),
    ("topics/signals.txt", "How do I run a function whenever a model instance is saved?", "Listening to signals"),
    ("topics/async.txt", "Can my views be coroutines written with async def?", "Async views"),
    ("topics/async.txt", "How do I call synchronous code from asynchronous code?", "``sync_to_async()``"),
    ("topics/testing/tools.txt", "How do I make requests to my views from a test without a server?", "The test client"),
    ("topics/checks.txt", "How do I add my own checks to manage.py check?", "Writing your own checks"),
    ("howto/csrf.txt", "How do I send the CSRF token with an AJAX request?", "Using CSRF protection with AJAX"),
    ("howto/outputting-csv.txt", "How do I let users download a spreadsheet-like file generated by a view?", "Using the Python CSV library"),
    ("howto/custom-management-commands.txt", "How do I add my own manage.py command?", "How to create custom ``django-admin`` commands"),
    ("howto/writing-migrations.txt", "How do I decide the order in which migrations run?", "Controlling the order of migrations"),
    ("howto/static-files/index.txt", "How do I serve CSS and JavaScript files in my project?", "Configuring static files"),
    ("howto/upgrade-version.txt", "What should I do about deprecation warnings before upgrading Django?", "Resolving deprecation warnings"),
    ("howto/logging.txt", "What is the quickest way to write something to the log from my code?", "Make a basic logging call"),
    ("topics/forms/index.txt", "How do I render a form in a template?", "The template"),
    ("topics/i18n/translation.txt", "How do I mark strings in Python code for translation?", "Standard translation"),
]


def natural_questions(files: dict[str, str]) -> list[Question]:
    out = []
    for rel, question, title in NATURAL:
        if rel not in files:
            raise SystemExit(f"natural question on {rel}, which is not in the corpus")
        if f"\n{title}\n" not in files[rel]:
            raise SystemExit(f"{rel} has no section titled {title!r}")
        out.append(Question(question, url_of(rel), title, "natural"))
    return out


def build(sdist: Path, seed: int = 7) -> list[Question]:
    files = docs(sdist)
    rng = random.Random(seed)
    picked = []
    for kind, questions, n in (("check", check_questions(files), 70), ("setting", setting_questions(files), 60),
                               ("command", command_questions(files), 30), ("release", release_questions(files), 40)):
        if len(questions) < min(n, 20):
            raise SystemExit(f"only {len(questions)} {kind} questions found")
        picked += rng.sample(questions, min(n, len(questions)))
    return picked + natural_questions(files)


def load_questions(path: Path = QUESTIONS) -> list[Question]:
    return [Question(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    if sys.argv[1:] != ["build"]:
        print(__doc__)
        return 2
    questions = build(fetch())
    with tempfile.NamedTemporaryFile("w", dir=HERE, delete=False) as out:
        for q in questions:
            out.write(json.dumps(asdict(q), ensure_ascii=False) + "\n")
    Path(out.name).replace(QUESTIONS)
    kinds = {}
    for q in questions:
        kinds[q.kind] = kinds.get(q.kind, 0) + 1
    print(f"{len(questions)} questions ({', '.join(f'{n} {k}' for k, n in kinds.items())}) in {QUESTIONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
