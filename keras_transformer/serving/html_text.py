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
content of ``<script>``, ``<style>``, ``<code>``, ``<pre>``, ``<textarea>``,
of the other raw-text elements (``<xmp>``, ``<iframe>``, ``<noembed>``,
``<noframes>``, ``<plaintext>``) and of any element with ``translate="no"``.
Attribute values (``alt``, ``title``) are not translated. Unbalanced markup
(unclosed tags, a stray ``</p>``) is read leniently: an unclosed ``<code>``
keeps the rest of the document untranslated, which errs on the side of
changing nothing; so does a tag, comment or doctype left open at the end,
which runs to the end of the document as in a browser. One byte may be
added: a reference left without its ``;`` just before a run's text
(``&#160``) gets one, so that it cannot run on into the translation.

The markup is read by a small tokenizer that follows the WHATWG HTML
tokenizer's states (data, tags and their quoted attribute values, comments,
bogus comments and doctypes, raw text up to its end tag) in one forward pass,
so parsing takes time linear in the markup: a server parses whatever a caller
sends. The standard library's ``html.parser.HTMLParser`` is quadratic on
malformed markup (100,000 characters of ``"<a\\n"`` take over a minute).
lxml (libxml2) parses in linear time but reports no source offsets, so its
tags could only be re-serialised, not copied as written.
"""

import collections
import html
import re
import string

# Elements whose content is code or user input, not prose to translate. The
# raw-text ones are here too: their content shows entities literally, so an
# escaped translation could not go back into it.
OPAQUE = frozenset(
    "script style code pre textarea xmp iframe noembed noframes plaintext".split()
)
# HTML's void elements have no content and no end tag, so they never stay open.
VOID = frozenset(
    "area base br col embed hr img input link meta param source track wbr".split()
)
# Elements whose content is text up to their own end tag, "<" and all: raw
# text (script, style, xmp, iframe, noembed, noframes) and escapable raw text
# (textarea, title). <plaintext> has no end tag: its content runs to the end.
# <noscript> is read as markup, as a browser without scripting shows it.
RAW_TEXT = frozenset("script style xmp iframe noembed noframes textarea title".split())
# Inside <svg> or <math> a <title> is an ordinary element whose content is
# markup. The other raw-text elements are opaque, so reading them as raw text
# there too can only keep more of the document as it is.
FOREIGN = ("svg", "math")

LETTERS = frozenset(string.ascii_letters)
# Tag and attribute names are compared ASCII case-insensitively, as HTML does
# (str.lower would also fold characters such as the Kelvin sign).
ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)

# A start or end tag's opening: "<" or "</", and a name that starts with an
# ASCII letter and runs to a space, "/" or ">".
TAG_NAME = re.compile(r"</?([a-zA-Z][^\t\n\f\r />]*)")
# One attribute with the spaces and stray "/" before it: a name (up to a
# space, "/", "=" or ">"; an "=" may open it), then maybe "=" and a value. A
# quoted value runs to its closing quote, or to the end of the document if it
# has none, so a ">" inside quotes never ends the tag; an unquoted value runs
# to a space or ">".
ATTRIBUTE = re.compile(
    r"""
    [\t\n\f\r /]*
    ([^\t\n\f\r />][^\t\n\f\r /=>]*)
    (?: [\t\n\f\r ]*=[\t\n\f\r ]*
        ( "[^"]*(?:"|\Z) | '[^']*(?:'|\Z) | [^\t\n\f\r >]* ) )?
    """,
    re.X,
)
# What may follow the last attribute before the tag's ">".
TAG_END = re.compile(r"[\t\n\f\r /]*")
# "-->" ends a comment, and so does "--!>"; "<!-->" and "<!--->" are whole.
COMMENT_END = re.compile(r"--!?>")
# A raw-text element ends at its end tag, in any case, before a space, "/"
# or ">"; re.A keeps the case folding to ASCII ("ſ" is no "s").
RAW_TEXT_END = {
    name: re.compile(rf"</{name}[\t\n\f\r />]", re.I | re.A) for name in RAW_TEXT
}
# A script's content has three states. "<!--" opens an escaped stretch, and
# "<script" inside it a doubly escaped one, where "</script>" only closes the
# inner "<script" instead of the element; "-->" ends either.
SCRIPT_DATA = re.compile(r"<!--|</script[\t\n\f\r />]", re.I | re.A)
SCRIPT_ESCAPED = re.compile(
    r"-->|</script[\t\n\f\r />]|<script[\t\n\f\r />]", re.I | re.A
)
SCRIPT_DOUBLE_ESCAPED = re.compile(r"-->|</script[\t\n\f\r />]", re.I | re.A)
# One character, or one character reference as html.unescape reads them.
ATOM = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[a-zA-Z][a-zA-Z0-9]*);?|.", re.S)
# A character reference without its ";" at the very end.
OPEN_REFERENCE = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[a-zA-Z][a-zA-Z0-9]*)\Z")
# A decimal character reference's digits after its leading zeros.
DECIMAL_REFERENCE = re.compile(r"&#0*([0-9]+)")


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
            text = " ".join(_unescape(core).split())
            if text:
                if OPEN_REFERENCE.search(lead):
                    # "&#160" or "&nbsp" would run on into the translation
                    # ("&#160" then "1 €" reads "&#1601 €"): close it.
                    lead += ";"
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


def _unescape(text):
    """``html.unescape``, safe on any input.

    A decimal reference longer than any code point (``&#99999999999``) is
    out of range, U+FFFD, as in browsers; html.unescape would convert all its
    digits to an int, which Python refuses past 4,300 digits.
    """
    if "&#" in text:
        text = DECIMAL_REFERENCE.sub(
            lambda m: "&#" + (m[1] if len(m[1]) < 8 else "1114112"), text
        )
    return html.unescape(text)


def _split_whitespace(raw):
    """``raw`` as (leading whitespace, the rest, trailing whitespace).

    Whitespace is judged after decoding, so ``&nbsp;`` at an end stays there.
    """
    atoms = [m.group() for m in ATOM.finditer(raw)]
    lead = 0
    while lead < len(atoms) and _unescape(atoms[lead]).isspace():
        lead += 1
    trail = len(atoms)
    while trail > lead and _unescape(atoms[trail - 1]).isspace():
        trail -= 1
    return "".join(atoms[:lead]), "".join(atoms[lead:trail]), "".join(atoms[trail:])


def _regions(markup):
    """``markup`` cut into (source text, is_text) pairs; adjacent text merged.

    The pieces concatenate back to ``markup`` exactly.
    """
    if not markup:
        return []
    changes = _Splitter(markup).changes()
    ends = [start for start, _ in changes[1:]] + [len(markup)]
    return [
        (markup[start:end], is_text)
        for (start, is_text), end in zip(changes, ends, strict=True)
    ]


def _is_translate_no(attribute):
    """Whether an ``ATTRIBUTE`` match is translate="no", in any case, with
    character references decoded."""
    name, value = attribute[1], attribute[2]
    if value is None or name.translate(ASCII_LOWER) != "translate":
        return False
    if value[:1] in ("'", '"'):
        value = value[1:-1]  # a tag that ends has closed its quotes
    return _unescape(value).translate(ASCII_LOWER) == "no"


class _Splitter:
    """One forward pass over the markup, marking which stretches are text.

    The methods are the tokenizer's states; a stack of open elements says
    whether data is to be translated (no opaque element open). Each scan
    starts where the one before stopped, and a construct left open runs to
    the end of the document, so the pass takes time linear in the markup.
    Text is only data outside opaque elements (and a <title>'s content);
    everything else is markup.
    """

    def __init__(self, markup):
        self.markup = markup
        self._changes = []  # (position, is_text) where the kind of source changes
        self.open = []  # (name, opaque) of the open elements, outermost first
        self.counts = collections.Counter()  # open elements by name
        self.opaque = 0  # how many open elements are opaque

    def changes(self):
        """Where text starts and stops: (position, is_text), in order."""
        markup = self.markup
        # The data state: text up to a "<" that opens a tag, comment or
        # declaration; data is where the current stretch of data began.
        pos = data = 0
        while (lt := markup.find("<", pos)) >= 0:
            read = self._reader(lt)
            if read is None:
                pos = lt + 1
                continue
            self._mark(data, lt, not self.opaque)
            pos = data = read(lt)
        self._mark(data, len(markup), not self.opaque)
        return self._changes

    def _mark(self, start, end, is_text):
        if start < end and (not self._changes or self._changes[-1][1] != is_text):
            self._changes.append((start, is_text))

    def _reader(self, lt):
        """The method that reads what the "<" at ``lt`` opens; None when
        the "<" is text: before a space, a digit or the like, and a "<" or
        "</" at the very end."""
        after = self.markup[lt + 1 : lt + 3]
        if after[:1] in LETTERS or (after[:1] == "/" and after[1:] in LETTERS):
            return self._tag
        if after == "!-" and self.markup.startswith("<!--", lt):
            return self._comment
        # A doctype, "<![CDATA[" (read as HTML reads it outside svg and
        # math), "<?", "</" before a non-letter, or "</>" (which browsers
        # drop): all run to the next ">".
        if after[:1] in ("!", "?") or (after[:1] == "/" and after[1:]):
            return self._to_next_gt
        return None

    def _to_next_gt(self, lt):
        end = self.markup.find(">", lt + 2) + 1 or len(self.markup)
        self._mark(lt, end, False)
        return end

    def _comment(self, lt):
        markup, start = self.markup, lt + len("<!--")
        if markup.startswith(">", start):
            end = start + 1
        elif markup.startswith("->", start):
            end = start + 2
        else:
            match = COMMENT_END.search(markup, start)
            end = match.end() if match else len(markup)
        self._mark(lt, end, False)
        return end

    def _tag(self, lt):
        markup = self.markup
        match = TAG_NAME.match(markup, lt)
        # One attribute at a time, each match starting where the last ended:
        # a single regex over them all would keep state for each one.
        pos, says_no = match.end(), False
        while attribute := ATTRIBUTE.match(markup, pos):
            pos = attribute.end()
            says_no = says_no or _is_translate_no(attribute)
        pos = TAG_END.match(markup, pos).end()
        if not markup.startswith(">", pos):
            # Open at the end of the document: a browser drops the tag and
            # reads nothing after it, so nothing after it is text either.
            self._mark(lt, len(markup), False)
            return len(markup)
        end = pos + 1
        self._mark(lt, end, False)
        name = match[1].translate(ASCII_LOWER)
        if match[0].startswith("</"):
            self._close(name)
            return end
        return self._open(name, says_no, end)

    def _open(self, name, says_no, end):
        """Reads a start tag's element from ``end``, just after its ">";
        ``says_no``: whether the tag has translate="no"."""
        if name in VOID:
            return end
        opaque = name in OPAQUE or says_no
        if name == "plaintext":
            stop = len(self.markup)
        elif name == "script":
            stop = self._script_end(end)
        elif name in RAW_TEXT and not (
            name == "title" and any(self.counts[n] for n in FOREIGN)
        ):
            match = RAW_TEXT_END[name].search(self.markup, end)
            stop = match.start() if match else len(self.markup)
            # A <title> never closed holds the rest of the document, tags and
            # all: kept as written, like a tag left open at the end.
            opaque = opaque or match is None
        else:
            # HTML ignores "/>" on a non-void element: a <code/> stays open.
            self.open.append((name, opaque))
            self.counts[name] += 1
            self.opaque += opaque
            return end
        # The raw text's end tag, if any, is read next as an ordinary end tag
        # that closes nothing, since the element was never pushed.
        self._mark(end, stop, not (opaque or self.opaque))
        return stop

    def _close(self, name):
        if not self.counts[name]:
            return  # an end tag with no open element is ignored, as browsers do
        # Closing an outer element closes what was left open inside it.
        while True:
            top, opaque = self.open.pop()
            self.counts[top] -= 1
            self.opaque -= opaque
            if top == name:
                return

    def _script_end(self, pos):
        """Where a script's content that starts at ``pos`` ends."""
        markup, state = self.markup, SCRIPT_DATA
        while match := state.search(markup, pos):
            token = match.group()
            if token == "<!--":
                # Search from its dashes: "<!-->" closes the stretch at once.
                state, pos = SCRIPT_ESCAPED, match.start() + 2
            elif token == "-->":
                state, pos = SCRIPT_DATA, match.end()
            elif token[1] != "/":
                state, pos = SCRIPT_DOUBLE_ESCAPED, match.end()
            elif state is SCRIPT_DOUBLE_ESCAPED:
                state, pos = SCRIPT_ESCAPED, match.end()
            else:
                return match.start()
        return len(markup)
