"""``pprobe install --site``: a dormant, guarded .pth in this environment's site-packages.

Python runs ``import`` lines of .pth files in site folders at every start-up. Ours checks one
environment variable (and whether ./pprobe.toml or $PPROBE_CONFIG exists) and does nothing
else unless PPROBE=1 or a config file asks for the probe, so every other Python process of
the environment is untouched. Any failure is printed as one line and start-up goes on.
"""

from __future__ import annotations

import os
import sysconfig

PTH_NAME = "pprobe-auto.pth"


def pth_line(package_root: str) -> str:
    """The .pth's one line. When site runs it at start-up, the probe starts once every site
    folder is on sys.path, just before sitecustomize: in a venv made with
    ``--system-site-packages`` the venv's .pth files run before the base interpreter's folder
    (where pprobe's dependencies may live) is added."""
    code = (
        "import os, sys\n"
        "v = os.environ.get('PPROBE', '').strip().lower()\n"
        "def start():\n"
        "  try:\n"
        "    try:\n"
        "      from pprobe import _startup\n"
        "    except ImportError:\n"
        f"      sys.path.append({package_root!r})\n"
        "      from pprobe import _startup\n"
        "    _startup.initialize(source='pth')\n"
        "  except SystemExit:\n"
        "    raise\n"
        "  except BaseException as e:\n"
        "    sys.stderr.write('pprobe: start-up failed: %r; running without pprobe\\n' % (e,))\n"
        "def later(site, then):\n"
        "  def run():\n"
        "    site.execsitecustomize = then\n"
        "    start()\n"
        "    then()\n"
        "  return run\n"
        "if v in ('1', 'true', 'yes', 'on') or (not v and (os.environ.get('PPROBE_CONFIG') "
        "or os.path.isfile('pprobe.toml'))):\n"
        "  site = sys.modules.get('site')\n"
        "  f = sys._getframe()\n"
        "  while f is not None and f.f_code is not getattr(getattr(site, 'main', None), "
        "'__code__', None):\n"
        "    f = f.f_back\n"
        "  if f is not None and callable(getattr(site, 'execsitecustomize', None)):\n"
        "    site.execsitecustomize = later(site, site.execsitecustomize)\n"
        "  else:\n"
        "    start()\n"
    )
    # The guard in front decides, without compiling the code, that there is nothing to do:
    # what every other Python process of the environment pays (a few microseconds).
    return (
        f"import os, sys; exec({code!r}, {{}}) if os.environ.get('PPROBE', '').strip() or "
        "os.environ.get('PPROBE_CONFIG') or os.path.isfile('pprobe.toml') else None\n"
    )


def site_dir() -> str:
    return sysconfig.get_paths()["purelib"]


def install() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(site_dir(), PTH_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(
            "# pprobe: dormant unless PPROBE=1 or ./pprobe.toml asks (pprobe uninstall --site)\n"
        )
        f.write(pth_line(root))
    os.replace(tmp, path)
    return path


def uninstall() -> str | None:
    path = os.path.join(site_dir(), PTH_NAME)
    if os.path.exists(path):
        os.unlink(path)
        return path
    return None
