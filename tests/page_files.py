"""Page files made by the tests (never files from elsewhere): drawn page images, PDFs, a password-protected PDF,
zips, decompression bombs. Shared by the unit, app and browser tests."""
from __future__ import annotations

import io
import struct
import zipfile
import zlib

from PIL import Image, ImageDraw


def page_image(width: int = 420, height: int = 560, lines: int = 8, seed: int = 0) -> Image.Image:
    """A white page with a title bar and a few grey 'text' lines."""
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    draw.rectangle([20, 20, width - 20, 60], fill=(30, 30, 30))
    for i in range(lines):
        y = 80 + i * 28
        draw.rectangle([20, y, width - 20 - (i * 37 + seed * 11) % (width // 3), y + 12], fill=(120, 120, 120))
    return img


def page_png(width: int = 420, height: int = 560, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    page_image(width, height, seed=seed).save(buf, format="PNG")
    return buf.getvalue()


def page_jpeg(width: int = 600, height: int = 400, seed: int = 1) -> bytes:
    buf = io.BytesIO()
    page_image(width, height, seed=seed).save(buf, format="JPEG", quality=80)
    return buf.getvalue()


def page_pdf(pages: int = 2, width: int = 300, height: int = 400, resolution: float = 144.0) -> bytes:
    """A PDF of `pages` drawn pages (Pillow writes it: one image per page)."""
    images = [page_image(width, height, seed=i) for i in range(pages)]
    buf = io.BytesIO()
    images[0].save(buf, format="PDF", save_all=True, append_images=images[1:], resolution=resolution)
    return buf.getvalue()


def locked_pdf() -> bytes:
    """A one-page PDF behind the standard security handler whose user password is not empty: PDFium asks for a
    password ('Incorrect password error'), as it does for a real password-protected file."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 300] >>",
            b"<< /Filter /Standard /V 1 /R 2 /O <" + b"ab" * 32 + b"> /U <" + b"cd" * 32 + b"> /P -4 >>"]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += (b"trailer\n<< /Size %d /Root 1 0 R /Encrypt 4 0 R /ID [<%s> <%s>] >>\nstartxref\n%d\n%%%%EOF\n"
            % (len(objs) + 1, b"01" * 16, b"01" * 16, xref))
    return bytes(out)


def zip_of(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def bomb_png(width: int = 40_000, height: int = 40_000) -> bytes:
    """A PNG whose header claims width x height pixels (a decompression bomb) with almost no data."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + \
        chunk(b"IEND", b"")
