"""The migrations live in sql/ at the checkout's root; the wheel carries a copy of them in
rag_pipeline/migrations, so that an installed release (an image built with `pip install .`) can
run `rag-pipeline db migrate` with no checkout beside it. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SQL = Path(__file__).resolve().parent / "sql"


class build_py_with_migrations(build_py):
    def run(self) -> None:
        super().run()
        files = sorted(SQL.glob("[0-9][0-9][0-9]_*.sql"))
        if not files:
            raise SystemExit(f"no migrations in {SQL}: the wheel would ship a database it cannot create")
        target = Path(self.build_lib) / "rag_pipeline" / "migrations"
        # build/lib is reused from one build to the next: a migration renamed or removed since must
        # not ride along, since `db migrate` applies every numbered file it finds.
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for path in files:
            shutil.copyfile(path, target / path.name)


setup(cmdclass={"build_py": build_py_with_migrations})
