"""Translating HTML: split markup into text runs, then put translations back.

LibreTranslate's ``format: "html"`` translates the text between tags and keeps
the markup. Our translators take plain sentences, so ``HtmlDocument.parse``
cuts the markup into *text runs* (the text between two tags) and
``render`` writes the markup back with each run replaced by its translation::

    doc = HtmlDocument.parse('<p>Hello <b>world</b></p>')
    doc.texts                      # ['Hello', 'world']
    doc.render(['Bonjour', 'monde'])  # '<p>Bonjour <b>monde</b></p>'

Each run is translated on its own: inline markup (``<b>``, ``<a>``) splits a
sentence into several runs, and the model sees the pieces without their
context. Moving tags inside a translated sentence needs an alignment the
models do not give; separate runs are simple and never lose or misplace a tag.

What is kept byte for byte, and never listed in ``texts``: tags (attributes,
quotes, case and ``/>`` as written, because tags are copied from the source
rather than re-serialised), comments, the doctype, whitespace-only runs, a
run's leading and trailing whitespace (``&nbsp;`` included), and the whole
content of ``<script>``, ``<style>``, ``<code>``, ``<pre>``, ``<textarea>``
and of any element with ``translate="no"``. Attribute values (``alt``,
``title``) are not translated. Unbalanced markup (unclosed tags, a stray
``</p>``) is read leniently: an unclosed ``<code>`` keeps the rest of the
document untranslated, which errs on the side of changing nothing.
"""

import html
import re
from html.parser import HTMLParser

# Elements whose content is code or user input, not prose to translate.
OPAQUE = frozenset({"script", "style", "code", "pre", "textarea"})
# HTML's void elements have no content and no end tag, so they never stay open.
VOID = frozenset(
    "area base br col embed hr img input link meta param source track wbr".split()
)
# HTMLParser hands back a tag or comment it could not parse (unterminated,
# malformed) as data; it is still markup and must not be escaped as text.
BROKEN_TAG = re.compile(r"<[a-zA-Z/!?]")
NEWLINE = re.compile("\n")
# One character, or one character reference as html.unescape reads them.
ATOM = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[a-zA-Z][a-zA-Z0-9]*);?|.", re.S)


class HtmlDocument:
    """Markup cut into text runs to translate and the markup kept around them.

    Attributes:
        texts: The runs to translate, in document order: entities decoded,
            whitespace at the ends stripped and inner runs of whitespace
            collapsed to one space.
    """

    def __init__(self, pieces, texts):
        # A str is markup kept as written; a (lead, trail) pair stands for
        # the next text run with the whitespace it had around it.
        self._pieces = pieces
        self.texts = texts

    @classmethod
    def parse(cls, markup):
        """Reads ``markup`` (a str); never raises on malformed HTML."""
        pieces, texts = [], []
        for raw, is_text in _regions(markup):
            lead, core, trail = _split_whitespace(raw) if is_text else ("", "", "")
            text = " ".join(html.unescape(core).split())
            if text:
                pieces.append((lead, trail))
                texts.append(text)
            else:
                pieces.append(raw)
        return cls(pieces, texts)

    def render(self, translations):
        """The markup with the i-th text run replaced by ``translations[i]``.

        Translations are HTML-escaped: a ``<`` in a translation is text.
        """
        translations = list(translations)
        if len(translations) != len(self.texts):
            raise ValueError(
                f"render() needs one translation per text run: the document "
                f"has {len(self.texts)} runs, received {len(translations)} "
                f"translations"
            )
        translated = iter(translations)
        out = []
        for piece in self._pieces:
            if isinstance(piece, str):
                out.append(piece)
            else:
                lead, trail = piece
                out.append(lead + html.escape(next(translated), quote=False) + trail)
        return "".join(out)


def _split_whitespace(raw):
    """``raw`` as (leading whitespace, the rest, trailing whitespace).

    Whitespace is judged after decoding, so ``&nbsp;`` at an end stays there.
    """
    atoms = [m.group() for m in ATOM.finditer(raw)]
    lead = 0
    while lead < len(atoms) and html.unescape(atoms[lead]).isspace():
        lead += 1
    trail = len(atoms)
    while trail > lead and html.unescape(atoms[trail - 1]).isspace():
        trail -= 1
    return "".join(atoms[:lead]), "".join(atoms[lead:trail]), "".join(atoms[trail:])


def _regions(markup):
    """``markup`` cut into (source text, is_text) pairs; adjacent text merged.

    The pieces concatenate back to ``markup`` exactly.
    """
    if not markup:
        return []
    bounds = {}
    opened = []
    start = 0
    while start < len(markup):
        splitter = _Splitter(markup, start, opened, bounds)
        try:
            splitter.feed(markup[start:])
            splitter.close()
            break
        except AssertionError:
            # _markupbase refuses some declarations (``<![foo[``) by raising;
            # keep that one up to its ">" as markup and read on after it.
            failed = splitter.position()
            end = markup.find(">", failed) + 1 or len(markup)
            bounds[failed] = False
            start = end
    # Slicing only where the kind changes keeps long documents linear.
    changes = []
    for here in sorted(p for p in bounds if p < len(markup)):
        kind = bounds[here]
        is_text = kind if kind is not None else markup[here] != "<"
        if not changes or changes[-1][1] != is_text:
            changes.append((here, is_text))
    ends = [here for here, _ in changes[1:]] + [len(markup)]
    return [
        (markup[here:end], is_text)
        for (here, is_text), end in zip(changes, ends, strict=True)
    ]


class _Splitter(HTMLParser):
    """Marks where each of HTMLParser's events starts in the source.

    ``bounds`` maps a source position to what starts there: True for text,
    False for markup, None for source no event covered (text the parser
    skipped, such as the ``&`` of a final ``AT&T``; markup if it opens with
    ``<``). Text is only ever what the parser reported as data or a
    character reference outside an opaque element, measured against the
    source, so an unexpected event can only make something markup.
    """

    def __init__(self, source, base, opened, bounds):
        super().__init__(convert_charrefs=False)
        self.source = source
        self.opened = opened  # (tag, opaque) of open elements, outermost first
        self.bounds = bounds
        self.unterminated = False
        ends = (m.end() for m in NEWLINE.finditer(source, base))
        self.line_starts = [base, *ends]
        self.bounds[base] = False if self._opaque() else None

    def position(self):
        line, column = self.getpos()
        return self.line_starts[line - 1] + column

    def _opaque(self):
        return any(opaque for _, opaque in self.opened)

    def _markup(self):
        self.bounds[self.position()] = False

    def _text(self, raw):
        if self.unterminated:
            return
        start = self.position()
        if self._opaque() or not self.source.startswith(raw, start):
            self.bounds[start] = False
        else:
            self.bounds[start] = True
            self.bounds.setdefault(start + len(raw), None)

    def handle_starttag(self, tag, attrs):
        self._markup()
        if tag not in VOID:
            no = any(k == "translate" and (v or "").lower() == "no" for k, v in attrs)
            self.opened.append((tag, tag in OPAQUE or no))

    def handle_startendtag(self, tag, attrs):
        self._markup()

    def handle_endtag(self, tag):
        self._markup()
        names = [name for name, _ in self.opened]
        if tag in names:
            # Closing an outer element closes what was left open inside it;
            # an end tag with no open element is ignored, as browsers do.
            del self.opened[len(names) - 1 - names[::-1].index(tag) :]

    def handle_data(self, data):
        start = self.position()
        if BROKEN_TAG.match(self.source, start):
            self.bounds[start] = False
            # A lone "<" is how HTMLParser gives up on a tag or comment left
            # open at the end of the document: all the rest is that markup.
            self.unterminated = self.unterminated or data == "<"
        else:
            self._text(data)

    # A reference's closing ";" falls in the gap after it, which is text.
    def handle_entityref(self, name):
        self._text("&" + name)

    def handle_charref(self, name):
        self._text("&#" + name)

    def handle_comment(self, data):
        self._markup()

    def handle_decl(self, decl):
        self._markup()

    def handle_pi(self, data):
        self._markup()

    def unknown_decl(self, data):
        self._markup()
