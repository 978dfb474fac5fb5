#!/usr/bin/env python3
"""Draw the bundled sample pages (committed under samples/; rerun to regenerate).

The article's three image types: an English A4 document, a Chinese/mixed-language flyer
and a table screenshot. Drawn rather than scanned so they carry no copyright and are
small. Needs DejaVu fonts and, for the flyer, WenQuanYi Zen Hei (Debian: fonts-dejavu,
fonts-wqy-zenhei).
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

DEJAVU = "/usr/share/fonts/truetype/dejavu/"
CJK = "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc"
A4_AT_1540 = (1089, 1540)  # 210 x 297 mm with the longest edge at the model's 1540 px

PARAGRAPHS = [
    "Optical character recognition turns the image of a page into text that software can search, "
    "index and quote. Modern vision-language models read the whole page at once: headings, "
    "paragraphs, tables and formulas come out in reading order as Markdown.",
    "This report measures a LightOnOCR-2-1B deployment served by vLLM. Each page is rendered at "
    "200 DPI with its longest edge at 1540 pixels, which costs about 2,150 image tokens. Throughput "
    "is reported in pages per second and output tokens per second at concurrency 1, 2 and 4.",
    "The cost per page follows from the throughput: at 3.5 pages per second a single GPU reads "
    "about 300,000 pages a day. Latency matters for interactive use; throughput matters for batch "
    "jobs. Both depend on how many pages the server decodes at the same time.",
]


def font(name: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(name, size)


def english_document(path: Path) -> None:
    image = Image.new("RGB", A4_AT_1540, "white")
    draw = ImageDraw.Draw(image)
    margin, y = 90, 90
    draw.text((margin, y), "Serving OCR at Scale", font=font(DEJAVU + "DejaVuSerif-Bold.ttf", 44), fill="black")
    y += 70
    draw.text((margin, y), "Technical note 7 — November 2026", font=font(DEJAVU + "DejaVuSerif-Italic.ttf", 24), fill="#333")
    y += 70
    body = font(DEJAVU + "DejaVuSerif.ttf", 24)
    for number, paragraph in enumerate(PARAGRAPHS, 1):
        draw.text((margin, y), f"{number}. Section {number}", font=font(DEJAVU + "DejaVuSerif-Bold.ttf", 30), fill="black")
        y += 50
        for line in textwrap.wrap(paragraph, 68):
            draw.text((margin, y), line, font=body, fill="black")
            y += 36
        y += 30
    draw.text((margin, y), "The throughput of n parallel streams:", font=body, fill="black")
    y += 50
    draw.text((margin + 120, y), "T(n) = n · L / (t_prefill + L · t_token(n))",
              font=font(DEJAVU + "DejaVuSerif-Italic.ttf", 28), fill="black")
    y += 80
    for line in textwrap.wrap(PARAGRAPHS[0] + " " + PARAGRAPHS[2], 68)[:8]:
        draw.text((margin, y), line, font=body, fill="black")
        y += 36
    draw.text((A4_AT_1540[0] // 2 - 10, A4_AT_1540[1] - 70), "1", font=body, fill="black")
    image.save(path, optimize=True)


def chinese_flyer(path: Path) -> None:
    image = Image.new("RGB", (1100, 1540), "#fff8e7")
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, 1100, 230), fill="#b22222")
    draw.text((70, 50), "春季读书节", font=font(CJK, 96), fill="white")
    draw.text((70, 170), "Spring Reading Festival 2026", font=font(DEJAVU + "DejaVuSans-Bold.ttf", 36), fill="white")
    lines = [
        ("时间：2026年4月18日 – 4月20日", 40),
        ("地点：市图书馆一楼大厅 (City Library, Hall 1)", 40),
        ("", 20),
        ("活动内容 / Programme", 48),
        ("・作家签售会 Author signing — 10:00", 36),
        ("・古籍修复展览 Book restoration exhibition", 36),
        ("・儿童故事时间 Story time for kids — 14:30", 36),
        ("・二手书交换 Second-hand book swap", 36),
        ("", 20),
        ("门票：免费 Free admission", 44),
        ("咨询电话 Tel: +86 10 1234 5678", 36),
        ("日本語の本もあります。", 36),
    ]
    y = 290
    for text, size in lines:
        if text:
            draw.text((70, y), text, font=font(CJK, size), fill="#222")
        y += size + 34
    draw.rounded_rectangle((70, 1330, 1030, 1460), radius=24, fill="#b22222")
    draw.text((110, 1365), "欢迎参加！ Everyone welcome!", font=font(CJK, 52), fill="white")
    image.save(path, optimize=True)


def table_screenshot(path: Path) -> None:
    header = ["Region", "Q1", "Q2", "Q3", "Q4", "Total"]
    rows = [
        ["North", "1,204", "1,356", "1,410", "1,622", "5,592"],
        ["South", "988", "1,021", "1,130", "1,245", "4,384"],
        ["East", "1,512", "1,498", "1,605", "1,733", "6,348"],
        ["West", "743", "802", "865", "910", "3,320"],
        ["Total", "4,447", "4,677", "5,010", "5,510", "19,644"],
    ]
    cell_w, cell_h, left, top = 180, 64, 40, 110
    image = Image.new("RGB", (left * 2 + cell_w * len(header), top + cell_h * (len(rows) + 1) + 60), "white")
    draw = ImageDraw.Draw(image)
    draw.text((left, 35), "Pages processed per region (thousands)", font=font(DEJAVU + "DejaVuSans-Bold.ttf", 30), fill="black")
    regular, bold = font(DEJAVU + "DejaVuSans.ttf", 26), font(DEJAVU + "DejaVuSans-Bold.ttf", 26)
    for r, row in enumerate([header] + rows):
        y = top + r * cell_h
        fill = "#dde6f5" if r == 0 else ("#f4f4f4" if r % 2 == 0 else "white")
        draw.rectangle((left, y, left + cell_w * len(header), y + cell_h), fill=fill)
        for c, value in enumerate(row):
            x = left + c * cell_w
            draw.rectangle((x, y, x + cell_w, y + cell_h), outline="#888")
            draw.text((x + 16, y + 17), value, font=bold if r == 0 or row[0] == "Total" else regular, fill="black")
    image.save(path, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "samples",
                        help="folder to write (default: samples/)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    english_document(args.out / "english_a4_document.png")
    chinese_flyer(args.out / "chinese_mixed_flyer.png")
    table_screenshot(args.out / "table_screenshot.png")
    print(f"wrote 3 sample pages to {args.out}")


if __name__ == "__main__":
    main()
