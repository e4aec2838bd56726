"""The extras: one table in the package (``captioning.utils.extras.EXTRAS``), setup.cfg's
``[options.extras_require]`` and the README's list name the same extras, the README says what each
enables in the table's words, and each extra's modules are installed by that extra's own requirements."""

from __future__ import annotations

import configparser
import re
from importlib.metadata import packages_distributions

from tool_runs import REPO

from captioning.utils.extras import EXTRAS


def _setup_extras() -> dict[str, list[str]]:
    """setup.cfg's extras -> the distribution names of their requirements (lower case, ``_`` as ``-``)."""
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg", encoding="utf-8")
    extras = {}
    for name, text in parser["options.extras_require"].items():
        requirements = [line.strip() for line in text.splitlines() if line.strip()]
        extras[name] = [re.split(r"[<>=!~ \[;]", line)[0].lower().replace("_", "-") for line in requirements]
    return extras


def _readme_extras() -> dict[str, str]:
    """The README's list of extras: ``[name]`` -> the words after it, up to the next ``;``."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    paragraph = next(p for p in readme.split("\n\n") if p.startswith("`pip install -e .` is the runtime"))
    text = " ".join(paragraph.split())
    found = re.findall(r"`\[([a-z-]+)\]` ([^;]+?)(?=;|\. Without)", text)
    return dict(found)


def test_readme_setup_cfg_and_the_table_list_the_same_extras():
    setup = set(_setup_extras()) - {"test"}
    readme = _readme_extras()
    assert set(readme) - {"test"} == setup == set(EXTRAS)


def test_the_readme_says_what_each_extra_enables_in_the_tables_words():
    readme = _readme_extras()
    for name, extra in EXTRAS.items():
        assert readme[name] == extra.enables, name


def test_each_extras_modules_come_from_its_own_requirements():
    """The modules the checks look for are the ones that extra installs (not a dependency of another)."""
    setup = _setup_extras()
    providers = packages_distributions()
    for name, extra in EXTRAS.items():
        for module in extra.modules:
            distributions = {d.lower().replace("_", "-") for d in providers.get(module, [])}
            assert distributions, f"{module} of [{name}] is not installed in the test environment"
            assert distributions & set(setup[name]), (name, module, distributions, setup[name])


def test_the_test_extra_holds_every_other_extra():
    """What CI installs (``[test]`` over the runtime's requirements) has every extra's requirements."""
    setup = _setup_extras()
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg", encoding="utf-8")
    runtime = [line.strip() for line in parser["options"]["install_requires"].splitlines() if line.strip()]
    installed = set(setup["test"]) | {
        re.split(r"[<>=!~ \[;]", line)[0].lower().replace("_", "-") for line in runtime
    }
    for name in EXTRAS:
        assert set(setup[name]) <= installed, (name, set(setup[name]) - installed)
