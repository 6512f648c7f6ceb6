"""DeepSeek-OCR inference cost: analytic model, our PyTorch model, GPU session, measurement, run store.

This package never imports streamlit: the dashboard in app.py / pages/ is a thin layer over it.
"""
__version__ = "0.1.0"
