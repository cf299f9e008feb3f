"""The comparison menagerie: pairs of independently written implementations of one architecture, compared.

For each framework pair (:mod:`bench.compare_menagerie.pairs`) and each
architecture both frameworks implement, side a is built, run and traced in its
own virtualenv and writes the config, the inputs and its weights; side b is
built in another virtualenv from the same config, takes side a's weights
through a generic name-and-shape converter (:mod:`.convert`), is checked
against side a's untraced output, traced, and traced again once per injected
porting bug (:mod:`.bugs`). ``--compare`` loads both sides' traces where no
framework is needed and runs ``tl.compare`` on each (:mod:`.compare`);
``--report`` writes ``docs/compare-menagerie.md`` (:mod:`.report`).
"""
