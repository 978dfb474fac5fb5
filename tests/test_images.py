"""Image preparation: exact sizes, orientation, modes, and clear refusals."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from ocr_bundle.images import (
    InputError,
    decode_data_url,
    fit_longest_edge,
    is_pdf,
    pdf_page_count,
    prepare_image_bytes,
    prepare_upload,
    render_pdf_page,
)


def encode(image: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def decode(data_url: str) -> Image.Image:
    return decode_data_url(data_url)


def make_pdf(pages: int, size_pt: tuple[float, float] = (595, 842)) -> bytes:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument.new()
    for _ in range(pages):
        pdf.new_page(*size_pt)
    buffer = io.BytesIO()
    pdf.save(buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("size, expected", [
    ((3000, 2000), (1540, 1027)),
    ((2000, 3000), (1027, 1540)),
    ((1540, 1540), (1540, 1540)),
    ((800, 600), (800, 600)),      # never upscaled
    ((20000, 10), (1540, 1)),
])
def test_fit_longest_edge(size, expected):
    assert fit_longest_edge(*size) == expected


def test_large_page_is_resized_to_1540_and_sent_as_png():
    prepared = prepare_image_bytes(encode(Image.new("RGB", (2480, 3508), "white")))
    assert (prepared.width, prepared.height) == (1089, 1540)
    assert (prepared.original_width, prepared.original_height) == (2480, 3508)
    assert prepared.mime_type == "image/png" and prepared.data_url.startswith("data:image/png;base64,")
    assert decode(prepared.data_url).size == (1089, 1540)


def test_jpeg_on_request():
    prepared = prepare_image_bytes(encode(Image.new("RGB", (100, 50), "red")), fmt="JPEG")
    assert prepared.mime_type == "image/jpeg" and decode(prepared.data_url).format == "JPEG"


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (400, 200), "white")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    prepared = prepare_image_bytes(encode(image, "JPEG", exif=exif))
    assert (prepared.width, prepared.height) == (200, 400)


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "L", "CMYK", "1", "I;16"])
def test_every_mode_becomes_rgb(mode):
    image = Image.new(mode, (64, 32))
    fmt = "TIFF" if mode in ("CMYK", "I;16") else "PNG"
    assert decode(prepare_image_bytes(encode(image, fmt)).data_url).mode == "RGB"


def test_transparency_becomes_white_paper_not_black():
    prepared = prepare_image_bytes(encode(Image.new("RGBA", (10, 10), (0, 0, 0, 0))))
    assert decode(prepared.data_url).getpixel((5, 5)) == (255, 255, 255)


def test_sixteen_bit_grey_keeps_its_range():
    array = np.full((8, 8), 32768, dtype=np.uint16)
    prepared = prepare_image_bytes(encode(Image.fromarray(array), "PNG"))
    assert decode(prepared.data_url).getpixel((0, 0)) == (127, 127, 127)


def test_animated_gif_uses_the_first_frame():
    frames = [Image.new("P", (20, 20), color) for color in (1, 2)]
    data = io.BytesIO()
    frames[0].save(data, format="GIF", save_all=True, append_images=frames[1:])
    assert prepare_image_bytes(data.getvalue()).width == 20


@pytest.mark.parametrize("data, message", [
    (b"", "empty"),
    (b"hello, I am a text file", "not an image"),
    (encode(Image.new("RGB", (500, 500)))[:300], "truncated"),
])
def test_bad_files_get_clear_messages(data, message):
    with pytest.raises(InputError, match=message):
        prepare_image_bytes(data)


def test_truncated_jpeg_is_refused():
    data = encode(Image.effect_noise((600, 600), 50).convert("RGB"), "JPEG")[:2000]
    with pytest.raises(InputError, match="damaged or truncated"):
        prepare_image_bytes(data)


def test_decompression_bomb_is_refused_from_the_header():
    # A 20000 x 20000 PNG of one colour is tiny on disk and 400 MP in memory.
    bomb = encode(Image.new("1", (20000, 20000)), "PNG", optimize=True)
    assert len(bomb) < 200_000
    # Past Pillow's own limit (179 MP), the same plain message as below it: size, and the limit.
    with pytest.raises(InputError) as caught:
        prepare_image_bytes(bomb)
    assert str(caught.value) == "The image is 20000×20000 (400 MP); the limit is 100 MP. Downscale it first."
    assert Image.MAX_IMAGE_PIXELS == 89_478_485  # Pillow's limit is back in force afterwards
    # Below PIL's own bomb limit, the bundle's 100 MP limit answers with the size.
    big = encode(Image.new("1", (12000, 10000)), "PNG", optimize=True)
    with pytest.raises(InputError, match="12000×10000 \\(120 MP\\); the limit is 100 MP"):
        prepare_image_bytes(big)


def test_upload_size_limit():
    with pytest.raises(InputError, match="limit is 1 MB"):
        prepare_image_bytes(b"x" * 1_500_000, max_bytes=1_000_000)


def test_pdf_pages_are_rendered_at_200_dpi_capped_at_1540():
    pdf = make_pdf(3)
    assert is_pdf(pdf) and pdf_page_count(pdf) == 3
    page = render_pdf_page(pdf, 2)
    assert (page.width, page.height) == (1089, 1540)  # A4 at 200 DPI is 1654 x 2339: capped
    small = render_pdf_page(make_pdf(1, (288, 144)), 1)  # 4 x 2 inch: 200 DPI fits under 1540
    assert (small.width, small.height) == (800, 400)


def test_pdf_errors_are_clear():
    with pytest.raises(InputError, match="does not exist: the PDF has 3"):
        render_pdf_page(make_pdf(3), 4)
    with pytest.raises(InputError, match="damaged"):
        pdf_page_count(b"%PDF-1.7\n garbage without structure")
    with pytest.raises(InputError, match="pick a page"):
        prepare_image_bytes(make_pdf(1))


def test_prepare_upload_dispatches_on_content_not_name():
    assert prepare_upload(make_pdf(2), page_number=2).height == 1540
    assert prepare_upload(encode(Image.new("RGB", (30, 40)))).width == 30
