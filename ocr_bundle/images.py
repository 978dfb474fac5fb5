"""Prepare uploads (images and PDF pages) the way LightOnOCR-2-1B expects them.

The official recipe renders pages at 200 DPI with the longest edge at 1540 px (the vision
encoder's image_size). Doing it here, once, on the client means the server never decodes
a 40-megapixel scan, the request stays small, and the stress test encodes each page once
instead of once per request. PNG is the default encoding because it is lossless; JPEG is
an opt-in for slow links.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError

from .settings import PDF_RENDER_DPI, TARGET_LONGEST_EDGE

# A 600-DPI A4 scan is 35 MP; anything far beyond is a mistake or an attack (decompression
# bomb). Checked from the header, before any pixel is decoded.
MAX_IMAGE_PIXELS = 100_000_000
MAX_UPLOAD_BYTES = 50 * 1024 * 1024
MAX_PDF_PAGES_AT_ONCE = 20


class InputError(ValueError):
    """An upload that cannot become a page image; the message is meant for the user."""


@dataclass(frozen=True)
class PreparedImage:
    """A page image ready to send: encoded once, reused for every request."""

    data_url: str
    width: int
    height: int
    original_width: int
    original_height: int
    mime_type: str
    encoded_bytes: int
    dpi: int | None = None  # a PDF page's rendering resolution (what its pixels are per inch of paper)


def is_pdf(data: bytes) -> bool:
    # Sniff the content, not the file name: "scan.png" may well be a PDF.
    return data[:1024].lstrip().startswith(b"%PDF-")


def megabytes(n_bytes: float) -> str:
    """A size in MB (10^6 bytes, as every size limit of the bundle counts), never rounded to 0."""
    mb = n_bytes / 1e6
    return f"{mb:.1f} MB" if mb >= 10 else f"{mb:.3g} MB"


def check_size(n_bytes: int, max_bytes: int = MAX_UPLOAD_BYTES) -> None:
    """Refuse empty and oversized uploads; callers with a path check before reading the file."""
    if n_bytes == 0:
        raise InputError("The file is empty (0 bytes).")
    if n_bytes > max_bytes:
        raise InputError(f"The file is {megabytes(n_bytes)}; the limit is {megabytes(max_bytes)}.")


def check_upload_size(data: bytes, max_bytes: int = MAX_UPLOAD_BYTES) -> None:
    check_size(len(data), max_bytes)


# Pillow's bomb limit is a module global; it is lifted only to read the size of an image
# Pillow has already refused, so that the user gets the same message either side of it.
_PILLOW_LIMIT_LOCK = threading.Lock()


ImageSource = bytes | Path


def _readable(source: ImageSource):
    # A path is read by Pillow as needed: a 500-page TIFF is never held in memory whole.
    return source if isinstance(source, Path) else io.BytesIO(source)


def _header_size_past_pillow_limit(source: ImageSource) -> tuple[int, int]:
    with _PILLOW_LIMIT_LOCK:
        saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
        try:
            with Image.open(_readable(source)) as image:  # the header only: no pixel is decoded
                return image.size
        finally:
            Image.MAX_IMAGE_PIXELS = saved


def _too_many_pixels(width: int, height: int, max_pixels: int) -> InputError:
    return InputError(f"The image is {width}×{height} ({width * height / 1e6:.0f} MP); "
                      f"the limit is {max_pixels / 1e6:.0f} MP. Downscale it first.")


def _open_image(source: ImageSource, max_pixels: int) -> Image.Image:
    """Open an image lazily, refusing bombs from the header alone."""
    try:
        with warnings.catch_warnings():
            # PIL warns (and errors at 2x) above its own global limit; ours is explicit.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(_readable(source))
    except Image.DecompressionBombError as exc:
        raise _too_many_pixels(*_header_size_past_pillow_limit(source), max_pixels) from exc
    except UnidentifiedImageError as exc:
        raise InputError("This file is not an image or PDF that can be read (unknown format).") from exc
    except OSError as exc:
        raise InputError(f"The image could not be read: {exc}.") from exc
    _check_pixels(image, max_pixels)
    return image


def _check_pixels(image: Image.Image, max_pixels: int) -> None:
    width, height = image.size
    if width < 1 or height < 1:
        raise InputError("The image has no pixels.")
    if width * height > max_pixels:
        raise _too_many_pixels(width, height, max_pixels)


def _to_rgb(image: Image.Image) -> Image.Image:
    """Convert any PIL mode to RGB; transparency becomes white paper, not black."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # 16-bit grey: convert("L") would clip everything above 255 to white.
        import numpy as np

        array = np.asarray(image, dtype=np.uint32)
        peak = max(int(array.max()), 1)
        scale = 255.0 / (65535 if peak > 255 else 255)
        return Image.fromarray((array * scale).astype("uint8"), "L").convert("RGB")
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa"):
        image = image.convert("RGBA")
        paper = Image.new("RGB", image.size, (255, 255, 255))
        paper.paste(image, mask=image.getchannel("A"))
        return paper
    if image.mode != "RGB":
        return image.convert("RGB")
    return image


def fit_longest_edge(width: int, height: int, longest: int = TARGET_LONGEST_EDGE) -> tuple[int, int]:
    """Size that brings the longest edge down to `longest`; never upscales."""
    scale = longest / max(width, height)
    if scale >= 1:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def encode_image(image: Image.Image, fmt: str = "PNG") -> tuple[bytes, str]:
    fmt = fmt.upper()
    buffer = io.BytesIO()
    if fmt == "PNG":
        # compress_level 1: ~5x faster than the default for ~10% more bytes; on loopback
        # or a LAN the bytes are cheap, the client's CPU is not.
        image.save(buffer, format="PNG", compress_level=1)
        return buffer.getvalue(), "image/png"
    if fmt in ("JPEG", "JPG"):
        image.save(buffer, format="JPEG", quality=95, subsampling=0)
        return buffer.getvalue(), "image/jpeg"
    raise ValueError(f"unsupported encoding {fmt!r} (use PNG or JPEG)")


def to_data_url(payload: bytes, mime_type: str) -> str:
    return f"data:{mime_type};base64,{base64.b64encode(payload).decode('ascii')}"


def decode_data_url(data_url: str) -> Image.Image:
    """The image inside a data URL (for previews and for the transformers baseline)."""
    return Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1])))


def prepare_pil_image(
    image: Image.Image,
    fmt: str = "PNG",
    longest_edge: int = TARGET_LONGEST_EDGE,
) -> PreparedImage:
    """Orient, convert to RGB, downscale and encode an already-open image."""
    # An animated GIF/WebP is one page: its first frame, where Image.open leaves it. A
    # multi-page TIFF is a document: callers seek to the frame they want (tiff_page).
    original_width, original_height = image.size
    if image.format == "JPEG":
        # Let libjpeg decode at 1/2, 1/4, 1/8 scale when the page is far larger than needed.
        image.draft("RGB", fit_longest_edge(*image.size, longest_edge))
    try:
        image = ImageOps.exif_transpose(image)
        image = _to_rgb(image)
    except (OSError, SyntaxError, ValueError) as exc:
        # Truncated files fail here, when pixels are first decoded.
        raise InputError(f"The image is damaged or truncated and cannot be decoded ({exc}).") from exc
    size = fit_longest_edge(*image.size, longest_edge)
    if size != image.size:
        image = image.resize(size, Image.Resampling.LANCZOS)
    payload, mime_type = encode_image(image, fmt)
    return PreparedImage(
        data_url=to_data_url(payload, mime_type),
        width=image.width,
        height=image.height,
        original_width=original_width,
        original_height=original_height,
        mime_type=mime_type,
        encoded_bytes=len(payload),
    )


def prepare_image_bytes(
    data: bytes,
    fmt: str = "PNG",
    longest_edge: int = TARGET_LONGEST_EDGE,
    max_pixels: int = MAX_IMAGE_PIXELS,
    max_bytes: int = MAX_UPLOAD_BYTES,
) -> PreparedImage:
    """Bytes of an image file → PreparedImage, or InputError with a readable reason."""
    check_upload_size(data, max_bytes)
    if is_pdf(data):
        raise InputError("This is a PDF: pick a page to render (PDF pages are rendered at 200 DPI).")
    return prepare_pil_image(_open_image(data, max_pixels), fmt, longest_edge)


# ---------------------------------------------------------------- PDFs


PdfSource = bytes | str | Path


def open_pdf(source: PdfSource):
    """A pypdfium2 document from bytes or a path (a path is read by pdfium as needed, so a
    1,000-page file is never held in memory). Not thread-safe: one document, one thread."""
    import pypdfium2 as pdfium

    try:
        return pdfium.PdfDocument(str(source) if isinstance(source, Path) else source)
    except pdfium.PdfiumError as exc:
        reason = str(exc)
        if "password" in reason.lower():
            raise InputError("The PDF is encrypted (password protected); decrypt it first.") from exc
        raise InputError(f"The PDF is damaged and cannot be opened ({reason}).") from exc


def pdf_page_count(source: PdfSource, max_bytes: int = MAX_UPLOAD_BYTES) -> int:
    check_size(len(source) if isinstance(source, bytes) else Path(source).stat().st_size, max_bytes)
    pdf = open_pdf(source)
    try:
        count = len(pdf)
    finally:
        pdf.close()
    if count < 1:
        raise InputError("The PDF has no pages.")
    return count


def render_page_of(
    pdf,
    page_number: int,
    fmt: str = "PNG",
    dpi: int = PDF_RENDER_DPI,
    longest_edge: int = TARGET_LONGEST_EDGE,
) -> PreparedImage:
    """Render one page (1-based) of an open document at `dpi`, capped so the longest edge is
    `longest_edge`. The scale is chosen before rendering, so an A0 poster never becomes a
    100 MP bitmap."""
    count = len(pdf)
    if not 1 <= page_number <= count:
        raise InputError(f"Page {page_number} does not exist: the PDF has {count} page(s).")
    page = pdf[page_number - 1]
    try:
        width_pt, height_pt = page.get_size()
        scale = min(dpi / 72, longest_edge / max(width_pt, height_pt, 1e-6))
        bitmap = page.render(scale=scale, draw_annots=True)
        image = bitmap.to_pil()
    except Exception as exc:  # pdfium raises its own and ctypes errors on broken pages
        raise InputError(f"Page {page_number} of the PDF cannot be rendered ({exc}).") from exc
    finally:
        page.close()
    return dataclasses.replace(prepare_pil_image(image, fmt, longest_edge), dpi=round(scale * 72))


def render_pdf_page(
    data: bytes,
    page_number: int,
    fmt: str = "PNG",
    dpi: int = PDF_RENDER_DPI,
    longest_edge: int = TARGET_LONGEST_EDGE,
    max_bytes: int = MAX_UPLOAD_BYTES,
) -> PreparedImage:
    """One page (1-based) of a PDF held in memory (the page's uploads); see render_page_of."""
    check_upload_size(data, max_bytes)
    pdf = open_pdf(data)
    try:
        return render_page_of(pdf, page_number, fmt, dpi, longest_edge)
    finally:
        pdf.close()


def prepare_upload(
    data: bytes,
    page_number: int = 1,
    fmt: str = "PNG",
    max_bytes: int = MAX_UPLOAD_BYTES,
) -> PreparedImage:
    """An image file, or one page of a PDF: the single entry point for 'a file the user gave'."""
    check_upload_size(data, max_bytes)
    if is_pdf(data):
        return render_pdf_page(data, page_number, fmt, max_bytes=max_bytes)
    return prepare_image_bytes(data, fmt, max_bytes=max_bytes)


# ---------------------------------------------------------------- multi-page TIFFs


def tiff_page_count(path: Path) -> int:
    """Pages (frames) of a TIFF file; 1 for any other image, or one Pillow cannot identify
    (preparing its page will say why)."""
    try:
        with Image.open(path) as image:
            return getattr(image, "n_frames", 1) if image.format == "TIFF" else 1
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return 1


def tiff_page(
    path: Path,
    page_number: int,
    fmt: str = "PNG",
    longest_edge: int = TARGET_LONGEST_EDGE,
    max_pixels: int = MAX_IMAGE_PIXELS,
) -> PreparedImage:
    """One page (1-based frame) of a multi-page TIFF, prepared like any image."""
    with _open_image(path, max_pixels) as image:
        count = getattr(image, "n_frames", 1)
        if not 1 <= page_number <= count:
            raise InputError(f"Page {page_number} does not exist: the TIFF has {count} page(s).")
        try:
            image.seek(page_number - 1)
        except (OSError, EOFError, ValueError) as exc:
            raise InputError(f"Page {page_number} of the TIFF cannot be read ({exc}).") from exc
        _check_pixels(image, max_pixels)  # each frame has its own size
        return prepare_pil_image(image, fmt, longest_edge)
