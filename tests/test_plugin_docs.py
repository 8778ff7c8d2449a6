"""docs/plugins.md: the hook and contract reference is generated from the docstrings, and
fails here when something is undocumented or the generated section is stale."""
from __future__ import annotations

import types
from pathlib import Path

import pluggy
import pytest

from hwbackends import docgen, hookspecs

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def test_every_hook_and_contract_class_is_documented():
    missing = docgen.missing_docs()
    assert not missing, (f"undocumented parts of the plugin contract: {', '.join(missing)}; "
                         f"add docstrings (or #: comments for Target attributes)")


def test_generated_reference_is_current():
    assert docgen.is_current(DOC), "docs/plugins.md is stale: run python -m hwbackends.docgen"


def test_every_hook_and_class_appears_in_the_docs():
    text = DOC.read_text()
    names = [n for n, _, _ in docgen.hook_specs()]
    assert {"hwb_targets", "hwb_converters", "hwb_choose"} <= set(names)
    for n in names:
        assert f"#### `{n}(" in text
    for obj in docgen.contract_objects():
        assert f"`{obj.__module__}.{obj.__name__}`" in text


def test_an_undocumented_hook_or_method_is_reported():
    spec = pluggy.HookspecMarker(hookspecs.PROJECT)
    mod = types.ModuleType("fake_hookspecs")

    @spec
    def hwb_documented() -> None:
        """Has a docstring."""

    @spec
    def hwb_bare() -> None:
        pass
    mod.hwb_documented, mod.hwb_bare = hwb_documented, hwb_bare

    class Documented:
        """A class with one undocumented public method."""

        def fine(self) -> None:
            """Documented."""

        def bare(self) -> None:
            pass

        def _private(self) -> None:
            pass

    class Naked:
        pass

    assert docgen.missing_docs(mod, [Documented, Naked]) == ["hook hwb_bare", "Documented.bare", "Naked"]


def test_check_fails_on_a_stale_section_and_regenerating_fixes_it(tmp_path, capsys):
    doc = tmp_path / "plugins.md"
    doc.write_text(DOC.read_text().replace("Return the targets this plugin provides.", "Old text."))
    assert docgen.main(["--check", str(doc)]) == 1
    assert "stale" in capsys.readouterr().err
    assert docgen.main([str(doc)]) == 0
    assert docgen.main(["--check", str(doc)]) == 0
    assert doc.read_text() == DOC.read_text()


def test_markers_are_required(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("# no markers\n")
    with pytest.raises(ValueError, match="markers are missing"):
        docgen.main([str(doc)])
