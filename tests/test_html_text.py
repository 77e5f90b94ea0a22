"""HTML in, text runs out, translations back in with the markup untouched."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_transformer.serving.html_text import HtmlDocument

pytestmark = pytest.mark.once


def translated(markup, translations):
    return HtmlDocument.parse(markup).render(translations)


def test_nested_inline_tags_give_one_run_each():
    markup = "<p>Hello <b>big <i>wide</i></b> world!</p>"
    assert HtmlDocument.parse(markup).texts == ["Hello", "big", "wide", "world!"]
    got = translated(markup, ["Bonjour", "grand", "vaste", "monde !"])
    assert got == "<p>Bonjour <b>grand <i>vaste</i></b> monde !</p>"


def test_plain_text_is_one_run():
    assert HtmlDocument.parse("Just text, no tags.").texts == ["Just text, no tags."]
    assert translated("Just text.", ["Juste du texte."]) == "Juste du texte."


def test_empty_and_blank_documents_have_no_runs():
    assert HtmlDocument.parse("").texts == []
    assert HtmlDocument.parse("").render([]) == ""
    assert HtmlDocument.parse(" \n\t ").render([]) == " \n\t "


def test_attributes_are_kept_as_written():
    markup = "<A Title=\"a > b\" href='/x?a=1&amp;b=2' data-x=y>link</A>"
    assert HtmlDocument.parse(markup).texts == ["link"]
    got = translated(markup, ["lien"])
    assert got == "<A Title=\"a > b\" href='/x?a=1&amp;b=2' data-x=y>lien</A>"


def test_doctype_case_and_self_closing_slashes_are_kept():
    markup = "<!DOCTYPE html><HTML><Body CLASS=x>Hi<br/>there<hr /></Body></HTML>"
    got = translated(markup, ["Salut", "toi"])
    assert got == "<!DOCTYPE html><HTML><Body CLASS=x>Salut<br/>toi<hr /></Body></HTML>"


def test_comments_are_kept_and_not_translated():
    markup = "<!-- do not <b>translate</b> -->Text<!--x-->"
    assert HtmlDocument.parse(markup).texts == ["Text"]
    assert (
        translated(markup, ["Texte"]) == "<!-- do not <b>translate</b> -->Texte<!--x-->"
    )


def test_script_and_style_are_kept_byte_for_byte():
    script = '<script>if (a < b && c > d) { x = "<p>Hi</p>"; }</script>'
    style = "<style>p > b { color: red }</style>"
    markup = f"{script}{style}<p>Hi</p>"
    assert HtmlDocument.parse(markup).texts == ["Hi"]
    assert translated(markup, ["Salut"]) == f"{script}{style}<p>Salut</p>"


@pytest.mark.parametrize(
    "kept",
    [
        "<code>x = y &amp;&amp; z</code>",
        "<pre>  two  spaces\n<b>bold</b></pre>",
        "<textarea>typed by the user</textarea>",
        '<span translate="no">Acme <b>Corp</b></span>',
        "<div TRANSLATE='No'><p>Kept</p></div>",
    ],
)
def test_opaque_elements_and_their_descendants_are_kept(kept):
    markup = f"<p>Visit {kept} today</p>"
    assert HtmlDocument.parse(markup).texts == ["Visit", "today"]
    assert translated(markup, ["Visitez", "aujourd'hui"]) == (
        f"<p>Visitez {kept} aujourd'hui</p>"
    )


def test_translation_resumes_after_an_opaque_element():
    markup = "<pre>a</pre><p translate=yes>b</p><code>c<i>d</i></code>e"
    assert HtmlDocument.parse(markup).texts == ["b", "e"]


def test_entities_are_decoded_text_and_translations_are_escaped():
    markup = "<p>&lt;b&gt; is a tag &amp; &#233;t&eacute; &#x41;</p>"
    assert HtmlDocument.parse(markup).texts == ["<b> is a tag & été A"]
    got = translated(markup, ['<i> "est" & plus'])
    assert got == '<p>&lt;i&gt; "est" &amp; plus</p>'


def test_a_bare_ampersand_or_less_than_stays_in_its_run():
    assert HtmlDocument.parse("AT&T rocks, a < b").texts == ["AT&T rocks, a < b"]
    assert HtmlDocument.parse("<b>x</b>AT&T").texts == ["x", "AT&T"]
    assert translated("a < b", ["c < d"]) == "c &lt; d"


def test_void_unclosed_and_stray_tags():
    markup = '</p>One<br>two<img src="a.png">three<p>four<li>five</div>six'
    expected = ["One", "two", "three", "four", "five", "six"]
    assert HtmlDocument.parse(markup).texts == expected
    got = translated(markup, ["1", "2", "3", "4", "5", "6"])
    assert got == '</p>1<br>2<img src="a.png">3<p>4<li>5</div>6'


def test_a_void_element_marked_translate_no_has_no_content_to_keep():
    markup = '<p><img src="logo.png" translate="no"> Acme <br translate=no>Corp</p>'
    assert HtmlDocument.parse(markup).texts == ["Acme", "Corp"]


@pytest.mark.parametrize(
    "markup, texts, rendered",
    [
        ("Hello <b", ["Hello"], "Bonjour <b"),
        ("Hello <b title='x", ["Hello"], "Bonjour <b title='x"),
        ("Hello <!-- unfinished", ["Hello"], "Bonjour <!-- unfinished"),
        ("Hello</>you", ["Hello", "you"], "Bonjour</>toi"),
        ("a<![foo[b]]>c", ["a", "c"], "Bonjour<![foo[b]]>toi"),
    ],
)
def test_broken_markup_neither_raises_nor_becomes_text(markup, texts, rendered):
    doc = HtmlDocument.parse(markup)
    assert doc.texts == texts
    assert doc.render(["Bonjour", "toi"][: len(texts)]) == rendered


def test_whitespace_around_runs_is_kept_and_inner_whitespace_collapsed():
    markup = "<p>\n  Hello   big\tworld \n</p>\n<ul>\n  <li> A</li>\n</ul>"
    assert HtmlDocument.parse(markup).texts == ["Hello big world", "A"]
    got = translated(markup, ["Salut", "B"])
    assert got == "<p>\n  Salut \n</p>\n<ul>\n  <li> B</li>\n</ul>"


def test_non_breaking_spaces_at_the_ends_are_kept():
    markup = "<td>&nbsp;Hello&nbsp;</td><td>&nbsp;</td>"
    assert HtmlDocument.parse(markup).texts == ["Hello"]
    assert translated(markup, ["Salut"]) == "<td>&nbsp;Salut&nbsp;</td><td>&nbsp;</td>"


def test_the_wrong_number_of_translations_is_refused():
    doc = HtmlDocument.parse("<p>one</p><p>two</p>")
    with pytest.raises(ValueError, match=r"has 2 runs, received 3"):
        doc.render(["a", "b", "c"])
    with pytest.raises(ValueError, match=r"has 2 runs, received 0"):
        doc.render([])


# A small HTML grammar: elements nest, and a run of text (words split by
# single spaces, any whitespace at the ends) always has markup on both sides.
ELEMENTS = ["b", "i", "p", "EM", 'span class="x"', "div id='main'", 'a href="/x?y"']
OPAQUE = ["<code>keep me</code>", '<span translate="no">keep <b>me</b></span>']
LEAVES = ["<br>", "<br/>", '<img src="a.png" alt="pic">', "<hr />", "<!-- note -->"]
LEAVES += ["</p>", *OPAQUE]
WORD = st.text(alphabet="abcxyzéßAB09.,!?'\"-", min_size=1, max_size=6)
SPACE = st.sampled_from(["", " ", "\n", "  \n\t"])
TAG = re.compile(r"<[^>]*>")


@st.composite
def runs(draw):
    """(lead, words, trail); words is "" for a whitespace-only run."""
    words = " ".join(draw(st.lists(WORD, max_size=4)))
    return draw(SPACE), words, draw(SPACE)


def trees():
    """A leaf, or (tag, [(run, child), ...], last run)."""
    return st.recursive(
        st.sampled_from(LEAVES),
        lambda inner: st.tuples(
            st.sampled_from(ELEMENTS), st.lists(st.tuples(runs(), inner)), runs()
        ),
        max_leaves=12,
    )


def write(tree, change):
    """The markup of ``tree``, each run's words passed through ``change``."""
    if isinstance(tree, str):
        return tree
    tag, pairs, last = tree
    out = [f"<{tag}>"]
    for (lead, words, trail), child in [*pairs, (last, "")]:
        out += [lead, change(words), trail, write(child, change)]
    return "".join(out) + f"</{tag.split()[0]}>"


def words_of(tree):
    if isinstance(tree, str):
        return []
    _, pairs, last = tree
    found = []
    for (_, words, _), child in [*pairs, (last, "")]:
        found += [words] if words else []
        found += words_of(child)
    return found


def prose(markup):
    """The text outside tags and opaque elements, whitespace collapsed."""
    for kept in OPAQUE:
        markup = markup.replace(kept, " ")
    return " ".join(TAG.sub(" ", markup).split())


@settings(max_examples=150, deadline=None)
@given(trees())
def test_rendering_the_texts_gives_the_markup_back(tree):
    markup = write(tree, lambda words: words)
    doc = HtmlDocument.parse(markup)
    assert doc.texts == words_of(tree)
    assert doc.render(doc.texts) == markup


@settings(max_examples=150, deadline=None)
@given(trees())
def test_rendering_changes_only_the_text(tree):
    markup = write(tree, lambda words: words)
    got = HtmlDocument.parse(markup).render(
        [t.upper() for t in HtmlDocument.parse(markup).texts]
    )
    assert got == write(tree, str.upper)
    assert TAG.findall(got) == TAG.findall(markup)
    assert prose(got) == prose(markup).upper()
