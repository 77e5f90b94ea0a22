"""The README's picture of kt-serve's page: a real server, a real browser.

    python -m benchmarks.page_screenshot --model runs/numbers/translator.keras \\
        --text "fifty-seven thousand four hundred twenty-one" \\
        --out docs/figures/kt-serve-page.png

Starts ``kt-serve`` on a free port of 127.0.0.1, opens its page in Debian's
headless chromium (``tests/browser.py``: the page tests' browser), types the
text, translates, and saves a screenshot of the whole page once the heat
map is drawn; then stops the server (SIGTERM, exit 0 expected).
"""

import argparse
import sys
import tempfile

from benchmarks import python_module
from benchmarks.serve_load import start_server, stop_server
from tests import browser


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--text", required=True, help="the sentence to translate")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1000)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    command = python_module(
        "keras_transformer.cli.serve", "--model", args.model, "--port", "0"
    )
    with tempfile.NamedTemporaryFile("w", prefix="kt-serve-") as log:
        process, url = start_server(command, log, timeout=300)
        driver = browser.chromium()
        try:
            translation, error = browser.translate_on_page(driver, url + "/", args.text)
            if error:
                print(f"the page says: {error}", file=sys.stderr)
                return 1
            # The whole page, not the first screenful: the window's height is
            # the page's plus the browser's own frame.
            page, frame = driver.execute_script(
                "return [document.documentElement.scrollHeight, "
                "window.outerHeight - window.innerHeight]"
            )
            driver.set_window_size(args.width, page + frame)
            browser.screenshot_to(driver, args.out)
        finally:
            driver.quit()
            code = stop_server(process)
    print(f"{args.text!r} -> {translation!r}; wrote {args.out}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
