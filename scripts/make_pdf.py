#!/usr/bin/env python3
"""Write a many-page PDF whose every page shows the same picture and its own "page N" label.

    python scripts/make_pdf.py --pages 300 --out /tmp/a4-300.pdf                  # the A4 sample, 300 pages
    python scripts/make_pdf.py --pages 1000 --image noise --page-inches 2 --out /tmp/noise.pdf

One JPEG image object is shared by all pages, so a 1,000-page file stays small while each
page still renders to a full bitmap: the batch converter's benchmark and its memory test
use it. The PDF is written by hand (a dozen objects), so nothing beyond Pillow is needed.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
A4_POINTS = (595.0, 842.0)


def jpeg_of(image: Image.Image, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def image_pdf(pages: int, jpeg: bytes, page_size: tuple[float, float] = A4_POINTS, label: bool = True) -> bytes:
    """A PDF of `pages` pages, each filled with the JPEG and labelled "page N" at the bottom."""
    return pictures_pdf([jpeg], pages, page_size, label)


def pictures_pdf(jpegs: list[bytes], pages: int | None = None, page_size: tuple[float, float] | None = None,
                 label: bool = False, dpi: float = 200.0) -> bytes:
    """A PDF whose page N shows jpegs[N - 1] (or the one JPEG on every page when there is one).

    page_size None: each page is its picture's size at `dpi`, so a renderer at that DPI gives
    the picture back pixel for pixel (the text pages of the reader's tests)."""
    pages = pages or len(jpegs)
    objects: list[bytes] = []  # object i+1

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled in once the page tree exists
    tree = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    pictures = []
    for jpeg in jpegs:
        width_px, height_px = Image.open(io.BytesIO(jpeg)).size
        pictures.append((add(b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceRGB "
                             b"/BitsPerComponent 8 /Filter /DCTDecode /Length %d >>\nstream\n"
                             % (width_px, height_px, len(jpeg)) + jpeg + b"\nendstream"), width_px, height_px))
    kids = []
    for number in range(1, pages + 1):
        picture, width_px, height_px = pictures[(number - 1) % len(pictures)]
        width, height = page_size or (width_px * 72 / dpi, height_px * 72 / dpi)
        text = b"BT /F1 %d Tf 12 8 Td (page %d) Tj ET" % (max(6, int(height / 40)), number) if label else b""
        content = b"q %.2f 0 0 %.2f 0 0 cm /Im0 Do Q\n%s" % (width, height, text)
        stream = add(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
        kids.append(add(b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 %.2f %.2f] /Contents %d 0 R "
                        b"/Resources << /XObject << /Im0 %d 0 R >> /Font << /F1 %d 0 R >> >> >>"
                        % (tree, width, height, stream, picture, font)))
    objects[catalog - 1] = b"<< /Type /Catalog /Pages %d 0 R >>" % tree
    objects[tree - 1] = (b"<< /Type /Pages /Count %d /Kids [" % pages + b" ".join(b"%d 0 R" % k for k in kids)
                         + b"] >>")
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for index, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % index + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.writelines(b"%010d 00000 n \n" % offset for offset in offsets)
    out.write(b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, catalog, xref))
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, required=True, help="number of pages")
    parser.add_argument("--image", default=str(ROOT / "samples" / "english_a4_document.png"),
                        help="picture on every page, or 'noise' (random pixels: large once rendered)")
    parser.add_argument("--page-inches", type=float, default=None,
                        help="square pages of this size (default: A4)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the PDF")
    args = parser.parse_args()
    picture = Image.effect_noise((600, 600), 80) if args.image == "noise" else Image.open(args.image)
    size = (args.page_inches * 72,) * 2 if args.page_inches else A4_POINTS
    args.out.write_bytes(image_pdf(args.pages, jpeg_of(picture), size))
    print(f"wrote {args.out}: {args.pages} pages, {args.out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
