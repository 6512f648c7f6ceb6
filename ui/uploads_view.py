"""The user's own pages for a dataset run: an upload box (page images, PDFs, zips of them), the files it refused
with the reason, and the kept uploads (name, kind, pages, pixel size, file size) with a checkbox to include each
in the next run and a button to remove it. Checking and keeping files is dsocr_core.measure.uploads' job; they are
kept in `<data folder>/uploads/` beside the run store, under generated names."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from . import resources
from .measured import md

MAX_LISTED = 200  # uploads drawn with their own row; more are summarised


def uploads_dir() -> Path:
    """`uploads/` beside the run store file (data/uploads by default; beside $DSOCR_STORE when set)."""
    return Path(resources.run_store().store.path).parent / "uploads"


def upload_store():
    from dsocr_core.measure.uploads import UploadStore

    return UploadStore(uploads_dir())


def _size(n: int) -> str:
    # decimal units, as Streamlit's uploader shows the same file (116.8KB there was 114 KB here)
    return f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} KB"


def panel() -> list[str]:
    """Draw the upload box, the refused files and the kept uploads; returns the ids of the uploads chosen for the
    run (in upload order)."""
    from dsocr_core.measure.uploads import ACCEPTED

    ups = upload_store()
    files = st.file_uploader(
        "Upload page images, PDFs or a zip of them", accept_multiple_files=True, key="up_files",
        help=f"{', '.join(ACCEPTED[:-2]).upper()} images, PDF files (each page rendered at the run's dpi, 144 as "
             "the vendor does) or a ZIP of them. Files are checked, then kept under generated names in "
             f"{uploads_dir()}; unreadable, empty, oversized or password-protected files are listed here with "
             "the reason and skipped.")
    seen = st.session_state.setdefault("up_seen", {})  # file id -> AddResult: each upload is checked once
    results = []
    for f in files or []:
        if f.file_id not in seen:
            with st.spinner(f"Checking {f.name} ..."):
                seen[f.file_id] = ups.add(f.name, f.getvalue())
        results.append(seen[f.file_id])
    rejected = [r for res in results for r in res.rejected]
    if rejected:
        st.warning(f"**{len(rejected)} file(s) skipped** (not kept, not run):\n\n"
                   + "\n".join(f"* {md(r.name)}: {md(r.reason)}" for r in rejected))
    kept = ups.list()
    if not kept:
        st.caption("No uploaded pages yet.")
        return []
    st.markdown(f"**Uploaded pages** ({len(kept)} file(s), {sum(u.pages for u in kept)} page(s); kept in "
                f"`{md(uploads_dir())}`)")
    chosen = []
    for u in kept[:MAX_LISTED]:
        c = st.columns([0.5, 5, 2, 2, 1.5, 1.2], vertical_alignment="center")
        if c[0].checkbox("use", value=True, key=f"up_use_{u.id}", label_visibility="collapsed",
                         help="Include this file in the next dataset run"):
            chosen.append(u.id)
        c[1].markdown(md(u.name))
        c[2].caption("image" if u.kind == "image" else f"PDF, {u.pages} page{'s' if u.pages > 1 else ''}")
        c[3].caption(f"{u.size_text} px" + (" (p1, 144 dpi)" if u.kind == "pdf" else ""))
        c[4].caption(_size(u.bytes))
        if c[5].button("Remove", key=f"up_rm_{u.id}", type="tertiary"):
            ups.remove(u.id)
            st.session_state.pop(f"up_use_{u.id}", None)
            st.rerun()
    if len(kept) > MAX_LISTED:
        chosen += [u.id for u in kept[MAX_LISTED:]]
        st.caption(f"... and {len(kept) - MAX_LISTED} more file(s), all included.")
    if st.button("Remove all uploaded pages", key="up_rm_all", type="tertiary"):
        for u in kept:
            ups.remove(u.id)
        st.rerun()
    return chosen
