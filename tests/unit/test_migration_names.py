"""An application's migration directory: every ``.sql`` file in it is a migration, named
``NNNN_name.sql``. One named otherwise was skipped, leaving the schema behind the code while
``accord migrate --check`` and every process's start said it was current."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.schemas.errors import MigrationError
from accord.schemas.migrate import directory_chain


def chain_of(tmp_path: Path, *names: str) -> list[int]:
    for name in names:
        (tmp_path / name).write_text("SELECT 1;\n")
    return [m.version for m in directory_chain("app", tmp_path).migrations]


def test_well_named_files_are_the_chain_and_other_files_are_not_read(tmp_path: Path) -> None:
    assert chain_of(tmp_path, "0001_init.sql", "0002_add_column.sql", "README.md") == [1, 2]


@pytest.mark.parametrize("name", ["0002_Add_Column.sql", "3_more.sql", "0003-more.sql", "x.SQL"])
def test_a_sql_file_named_otherwise_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    with pytest.raises(MigrationError) as refused:
        chain_of(tmp_path, "0001_init.sql", name)
    assert refused.value.fields["file"] == name
    assert "NNNN_name.sql" in str(refused.value)
