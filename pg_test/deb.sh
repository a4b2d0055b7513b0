# The Debian packaging that pg_test/package (the extension, one package per PostgreSQL version) and
# pg_test/package-cli (the pg-fence command) share, sourced from the repository's root: what
# Debian's tools compute and lintian checks, written once so that every package of the project
# gets it the same way.

DEB_MAINTAINER="pg_fence developers <maintainers@users.noreply.a-seed-7d603c91.example>"
# The packaging's own revision, after the upstream version: 0.5.0-1.
DEB_REVISION=1

# The date of the packaged commit, so that rebuilding the same tree writes the same files.
deb_date() { git log -1 --format=%aD 2>/dev/null || date -R; }

# deb_changelog SOURCE VERSION: a debian/changelog entry of the packaging.
deb_changelog() {
    printf '%s (%s) unstable; urgency=medium\n\n  * Packaged from the upstream tree; its changes are in changelog.gz.\n\n -- %s  %s\n' \
        "$1" "$2" "$DEB_MAINTAINER" "$(deb_date)"
}

# deb_copyright: the LICENSE in the machine-readable format (DEP-5), whose name for MIT is Expat.
deb_copyright() {
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: pg_fence"
    echo
    echo "Files: *"
    echo "Copyright: 2026 the pg_fence developers"
    echo "License: Expat"
    sed 's/^$/./; s/^/ /' LICENSE | tail -n +4
}

# deb_docs STAGE PACKAGE SOURCE VERSION: usr/share/doc/PACKAGE's changelog.gz (the project's
# CHANGELOG), changelog.Debian.gz and copyright, and the lintian override every package needs.
deb_docs() {
    local stage=$1 package=$2 source=$3 version=$4
    local doc=$stage/usr/share/doc/$package
    mkdir -p "$doc" "$stage/usr/share/lintian/overrides"
    gzip -9n <CHANGELOG.md >"$doc/changelog.gz"
    deb_changelog "$source" "$version" | gzip -9n >"$doc/changelog.Debian.gz"
    deb_copyright >"$doc/copyright"
    # Not uploaded to Debian: there is no ITP bug for the changelog to close.
    echo "$package: initial-upload-closes-no-bugs" >"$stage/usr/share/lintian/overrides/$package"
}

# deb_strip FILE...: as dh_strip strips a shared library or a program.
deb_strip() { strip --strip-unneeded --remove-section=.comment --remove-section=.note "$@"; }

# deb_shlibs PACKAGE FILE...: the Depends that dpkg-shlibdeps computes from the libraries FILEs
# link to. A symbol the server itself defines (an extension's) is found in no library: not a
# dependency, and not worth a warning.
deb_shlibs() {
    local package=$1; shift
    local work depends
    work=$(mktemp -d)
    # dpkg-shlibdeps reads debian/control of a source tree: a minimal one, in a scratch directory.
    mkdir -p "$work/debian"
    printf 'Source: %s\n\nPackage: %s\nArchitecture: amd64\n' "$package" "$package" >"$work/debian/control"
    local files=()
    for file in "$@"; do files+=("$(realpath "$file")"); done
    depends=$(cd "$work" && dpkg-shlibdeps -O "${files[@]}" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
    rm -rf "$work"
    [ -n "$depends" ] || { echo "pg_test/deb.sh: dpkg-shlibdeps found no dependencies of $*" >&2; return 1; }
    echo "$depends"
}

# deb_build STAGE DEB: the md5sums and the package, owned by root, then lintian (when installed)
# on it, failing on any warning.
deb_build() {
    local stage=$1 deb=$2
    chmod -R u+rwX,go+rX,go-w "$stage"
    (cd "$stage" && find usr -type f -exec md5sum {} + >DEBIAN/md5sums)
    dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
    deb_lintian "$deb"
}

deb_lintian() {
    command -v lintian >/dev/null || return 0
    lintian --fail-on error,warning "$@" 2> >(grep -v "running with root privileges" >&2)
    echo "   lintian $(basename "$1"): clean"
}

# deb_source SOURCE VERSION CONTROL RULES: the source package dist/SOURCE_VERSION.dsc in format
# 3.0 (quilt): the committed tree (git archive HEAD) as SOURCE_UPSTREAM.orig.tar.gz, and a debian/
# directory with CONTROL (its source stanza and binary stanzas), RULES, the changelog and copyright.
deb_source() {
    local source=$1 version=$2 control=$3 rules=$4
    local upstream=${version%-*}
    local work
    work=$(mktemp -d)
    git archive --format=tar --prefix="$source-$upstream/" HEAD | gzip -9n >"$work/${source}_$upstream.orig.tar.gz"
    tar -C "$work" -xzf "$work/${source}_$upstream.orig.tar.gz"
    local debian=$work/$source-$upstream/debian
    mkdir -p "$debian/source"
    echo "3.0 (quilt)" >"$debian/source/format"
    echo "$control" >"$debian/control"
    printf '%s\n' "$rules" >"$debian/rules"
    chmod 755 "$debian/rules"
    deb_changelog "$source" "$version" >"$debian/changelog"
    deb_copyright >"$debian/copyright"
    (cd "$work" && dpkg-source --build "$source-$upstream" >/dev/null)
    rm -f "dist/${source}_$upstream.orig.tar.gz" "dist/${source}_$version".*
    mv "$work/${source}_$upstream.orig.tar.gz" "$work/${source}_$version".* dist/
    rm -rf "$work"
    echo "   dist/${source}_$version.dsc"
    deb_lintian "dist/${source}_$version.dsc"
}
