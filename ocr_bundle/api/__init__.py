"""The document API: a PDF or an image in, each page's Markdown out, in Mistral's OCR shape.

documents.py  the request read and checked (data URLs, pages, limits): every refusal with its status
fair.py       slots to the OCR server shared by all requests, handed out in turn
service.py    a document through the converter's parts: render pool, PageReader, grounding crops
app.py        the routes (POST /v1/ocr, GET /v1/models, /health, /metrics), the key, disconnects
remote.py     the page's client of it ("All pages" of a PDF)
__main__.py   python -m ocr_bundle.api: settings, TLS, uvicorn
"""
