"""A run's output folder: what it holds, whether a run may use it, its writes.

Everything a run writes goes to one folder:

- ``run.json``: the settings, the backend, the status (``running`` until
  ``translator.keras`` is saved, ``trained`` until ``results.json`` is
  written, then ``finished``; ``diverged`` for a run whose loss or weights
  stopped being finite), why it stopped, if it stopped early, and the
  entries runs created there;
- ``tokenizer.model``, ``checkpoints/`` (resumable, written atomically),
  ``logs/`` (TensorBoard), ``ids/`` (a corpus tokenised on disk),
  ``translator.keras`` and ``results.json``.

A new or empty folder starts a run; an unfinished run with the same
settings resumes; a finished run, another run's settings or files that are
not a run's are refused. ``overwrite`` clears a folder only if runs wrote
everything in it: ``run.json`` lists each entry before the entry is created,
so a kill in between leaves at worst a name listed that was never created.
Every file is written atomically (a temporary file, then a rename).

One run writes a folder at a time: ``acquire`` takes its lock (``lock.py``)
for the whole run, and a second run is refused, naming the holder. Holding
it, a run knows every temporary file left there is stale, and removes them.
"""

import contextlib
import json
import os
import shutil

from keras_transformer.trainer import checkpoints
from keras_transformer.trainer.errors import UsageError
from keras_transformer.trainer.lock import FolderInUse, FolderLock

RUN_FILE = "run.json"
TOKENIZER_FILE = "tokenizer.model"
TRANSLATOR_FILE = "translator.keras"
RESULTS_FILE = "results.json"
CHECKPOINTS_DIR = "checkpoints"
LOGS_DIR = "logs"
IDS_DIR = "ids"
STATUSES = ("running", "trained", "finished", "diverged")
_FOLDERS = (CHECKPOINTS_DIR, LOGS_DIR)


class RunFolder:
    """The output folder of a run, and its ``run.json`` (``self.run``).

    Args:
        path: the folder; need not exist.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self.run = None
        self._lock = FolderLock(self.path)

    def acquire(self):
        """Hold the folder for this process until ``release``; ``UsageError``
        naming the process that holds it already."""
        try:
            self._lock.acquire()
        except FolderInUse as error:
            raise UsageError(
                f"`out` {error}: one run writes a folder at a time. Wait for it "
                "to end, or stop it (it resumes from its last checkpoint)."
            ) from None
        except OSError as error:
            raise UsageError(
                f"`out` {self.path}: cannot write its lock file "
                f"{self._lock.path} ({error.strerror})"
            ) from None

    def release(self):
        self._lock.release()

    def __repr__(self):
        return f"RunFolder({self.path!r})"

    def file(self, name):
        return os.path.join(self.path, name)

    @property
    def checkpoints(self):
        return self.file(CHECKPOINTS_DIR)

    @property
    def translator(self):
        return self.file(TRANSLATOR_FILE)

    def read(self):
        """``run.json`` as a dict; None if missing or not a run's."""
        try:
            with open(self.file(RUN_FILE), encoding="utf-8") as file:
                run = json.load(file)
        except (OSError, ValueError):
            return None
        if (
            not isinstance(run, dict)
            or run.get("status") not in STATUSES
            or not isinstance(run.get("settings"), dict)
            or not isinstance(run.get("created", []), list)
        ):
            return None
        return run

    # -- may a run use it? (reads only) ----------------------------------------

    def check(self, settings, overwrite=False):
        """The previous ``run.json`` to continue, or None for a new run.

        - missing or empty: a new run;
        - an unfinished run with the same ``settings``: resume it (or, if it
          was trained but its report is missing, write the report);
        - a finished run, another run's settings, or files that are not a
          run's: ``UsageError``. With ``overwrite`` the folder is to be
          cleared, which is refused unless runs wrote everything in it.

        Nothing is written or deleted here.
        """
        out = self.path
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"`out` {out} exists and is not a folder.")
        entries = set(os.listdir(out)) if os.path.isdir(out) else set()
        if not entries:
            return None
        run = self.read()
        if overwrite:
            self._refuse_foreign(run)
            return None
        if run is None:
            raise UsageError(
                f"`out` {out} is not empty and holds no {RUN_FILE} of a run; "
                "choose an empty or new folder."
            )
        reported = os.path.exists(self.file(RESULTS_FILE))
        if run["status"] == "diverged":
            raise UsageError(
                f"`out` {out} holds a run that diverged ({run.get('stopped')}); "
                "pass `overwrite` to train again from scratch, with other "
                "settings (a lower `lr_scale`, more `warmup_steps`)."
            )
        if run["status"] == "finished" and reported:
            raise UsageError(
                f"`out` {out} holds a finished run ({TRANSLATOR_FILE}). Pass "
                "`overwrite` to train again from scratch, or choose another `out`."
            )
        if run["status"] == "finished":
            # Marked finished before its report was written (by older
            # versions): the report is all that is left to do.
            run["status"] = "trained"
        changed = [
            f"{key}: {run['settings'].get(key)!r} there, {settings.get(key)!r} now"
            for key in sorted(set(run["settings"]) | set(settings))
            if run["settings"].get(key) != settings.get(key)
        ]
        if changed:
            # The values too: a default that changed between versions shows
            # as a setting the user never gave.
            raise UsageError(
                f"`out` {out} holds an unfinished run with other settings "
                f"({'; '.join(changed)}); rerun it with the same settings to "
                "resume, or pass `overwrite`."
            )
        return run

    def _refuse_foreign(self, run):
        foreign = self.not_ours(run)
        if not foreign:
            return
        shown = ", ".join(foreign[:5])
        if len(foreign) > 5:
            shown += f" and {len(foreign) - 5} more"
        if run is not None and "created" not in run:
            shown += f"; its {RUN_FILE} lists none, from an older version?"
        raise UsageError(
            f"`out` {self.path} holds files no run wrote ({shown}); refusing to "
            "clear it. Move them away or choose another `out`."
        )

    def not_ours(self, run=None):
        """What in the folder no run wrote: sorted relative paths.

        A run's are ``run.json`` and the entries it lists as created (``run``
        is that dict, or None), with the temporary files of their atomic
        writes; inside ``checkpoints/`` and ``logs/`` only what
        ``save_checkpoint`` and TensorBoard write there. Symbolic links never
        are: runs make none.
        """
        ours = {RUN_FILE, *run.get("created", [])} if run is not None else set()
        found = []
        for name in sorted(os.listdir(self.path)):
            path = self.file(name)
            link = os.path.islink(path)
            folder = os.path.isdir(path) and not link
            target = checkpoints.temporary_target(name)
            known = name in ours or (target in ours and target not in _FOLDERS)
            if link or not known or folder != (name in _FOLDERS):
                found.append(name + "/" if folder else name)
            elif name == CHECKPOINTS_DIR:
                found += [f"{name}/{p}" for p in checkpoints.foreign_files(path)]
            elif name == LOGS_DIR:
                found += [f"{name}/{p}" for p in _foreign_logs(path)]
        return found

    # -- writes ----------------------------------------------------------------

    def start(self, settings, backend, previous=None, overwrite=False):
        """The first writes of a run: clear the folder if ``overwrite``, then
        ``run.json``, status ``running``, keeping ``previous``'s list of
        entries when resuming."""
        if overwrite and os.path.isdir(self.path):
            self.clear()
        os.makedirs(self.path, exist_ok=True)
        self._remove_stale_temporaries()
        self.run = {
            "status": "running",
            "settings": settings,
            "backend": backend,
            "created": previous.get("created", []) if previous else [],
        }
        self._write_run()

    def _remove_stale_temporaries(self):
        """The temporary files and folders of writes that did not finish (a
        kill, a full disk): stale, since this run holds the folder."""
        if not self._lock.held:
            return
        for name in os.listdir(self.path):
            if checkpoints.temporary_target(name) is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.file(name))
        checkpoints.remove_temporaries(self.checkpoints)

    def will_create(self, *names):
        """List ``names`` (entries of the folder) in ``run.json`` as created
        by a run, before they are created."""
        created = sorted(set(self.run.get("created", [])).union(names))
        if created != self.run.get("created"):
            self.run["created"] = created
            self._write_run()

    def write_tokenizer(self, proto):
        self.will_create(TOKENIZER_FILE)
        checkpoints.write_atomic(self.file(TOKENIZER_FILE), proto, "tokenizer")

    def save_translator(self, translator, trained_seconds):
        """``translator.keras``, written atomically; status ``trained``."""
        self.will_create(TRANSLATOR_FILE)
        checkpoints.save_model_atomic(translator, self.translator, "translator")
        self.run["status"] = "trained"
        self.run["trained_seconds"] = round(trained_seconds, 1)
        self._write_run()

    def mark_stopped(self, status, reason):
        """Record in ``run.json`` that the run stopped, and why."""
        self.run["status"] = status
        self.run["stopped"] = reason
        self._write_run()

    def note_stop(self, reason):
        """Record why the run stopped early, its status left as it is (a
        preempted run resumes)."""
        self.run["stopped"] = reason
        self._write_run()

    def finish(self, results):
        """``results.json``, then status ``finished``: a run killed before
        this point writes its report when it is run again."""
        self.run = self.read()
        self.will_create(RESULTS_FILE)
        checkpoints.write_json_atomic(self.file(RESULTS_FILE), results, "results")
        self.run["status"] = "finished"
        self._write_run()

    def clear(self):
        """Delete a run's files, ``run.json`` (the list of them) last."""
        # Checked when the run started, but the tokenizer may have trained
        # for a while since: checked again right before deleting.
        foreign = self.not_ours(self.read())
        if foreign:
            raise UsageError(
                f"`out` {self.path} holds files no run wrote "
                f"({', '.join(foreign[:5])}); refusing to clear it."
            )
        for name in sorted(os.listdir(self.path), key=lambda name: name == RUN_FILE):
            path = self.file(name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)

    def _write_run(self):
        checkpoints.write_json_atomic(self.file(RUN_FILE), self.run, "run record")


def _foreign_logs(path):
    # The TensorBoard logs (event_log.EpochScalars): event files in train/ and
    # validation/.
    found = []
    for name in sorted(os.listdir(path)):
        folder = os.path.join(path, name)
        if (
            name not in ("train", "validation")
            or os.path.islink(folder)
            or not os.path.isdir(folder)
        ):
            found.append(name)
            continue
        for inner in sorted(os.listdir(folder)):
            file = os.path.join(folder, inner)
            if (
                not inner.startswith("events.out.tfevents.")
                or os.path.islink(file)
                or not os.path.isfile(file)
            ):
                found.append(f"{name}/{inner}")
    return found
