"""DeepSeek-OCR inference cost dashboard: `streamlit run app.py`.

Routes with st.navigation over the files in pages/ (listed here, never discovered), draws the shared sidebar
and hands its settings to the page (ui.page_setup()).
"""
import streamlit as st

import ui
from ui import resources, sidebar

# The icon ships with the app: a Material icon as page_icon makes the browser fetch it from a font CDN.
st.set_page_config(page_title="DeepSeek-OCR cost dashboard", page_icon=str(resources.PAGE_ICON), layout="wide")

PAGES = [
    st.Page("pages/overview.py", title="Overview", icon=":material/home:", default=True),
    st.Page("pages/analytic.py", title="Analytic sweep", icon=":material/show_chart:"),
    st.Page("pages/measured.py", title="Measured sweep", icon=":material/timer:"),
    st.Page("pages/parity.py", title="Vendor parity", icon=":material/compare:"),
    st.Page("pages/mfu.py", title="MFU", icon=":material/speed:"),
]

# once per process, before any page code: torch imported in the background by one thread, which so becomes torch's
# first importer (torch.profiler's backend must be initialised in that thread: resources.warm_up); the pages
# without a model do not wait for it, those that load one find it imported or wait only for what is left
resources.warm_up()
page = st.navigation(PAGES)
resources.run_store()  # opens the store and imports the bundled reference runs once per process
settings = sidebar.render()
with ui.app_context(settings):
    page.run()
