# make rpm     build the source tarball (this tree plus `go mod vendor`) and the RPMs from it,
#              with packaging/rpm/layerstore.spec, in a private rpmbuild tree; the RPMs end up
#              in RPM_OUTDIR, which it prints at the end
# make tarball only the source tarball, in _output/rpmbuild/SOURCES
# make clean   remove _output
#
# Variables: RPM_OUTDIR (default _output/rpm), GO, RPMBUILD, and VERSION / RELEASE to override
# what git describe gives (see rpm-version below).

GO         ?= go
RPMBUILD   ?= rpmbuild
OUTPUT     := $(CURDIR)/_output
TOPDIR     := $(OUTPUT)/rpmbuild
RPM_OUTDIR ?= $(OUTPUT)/rpm
SPEC       := packaging/rpm/layerstore.spec

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
# Each recipe is one script: the version computed at its top is used further down.
.ONESHELL:

# The package version, from the nearest tag vX.Y.Z (X.Y.Z-rc1 becomes X.Y.Z~rc1, which RPM
# sorts before X.Y.Z):
#   HEAD at the tag, clean tree        X.Y.Z-1
#   N commits after the tag            X.Y.Z-1.N.gitHASH
#   no tag yet                         0.0.0-0.N.gitHASH (N = commits in the history)
# with ".dirty" appended when the tree has changes or new files (the tarball is made from the
# working tree, not from HEAD, so that packaging changes can be built before they are
# committed). Outside a git checkout: 0.0.0-1, or VERSION=... RELEASE=... given on the command
# line. The binaries report `git describe` (or VERSION-RELEASE).
define rpm-version
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	hash=$$(git rev-parse --short=7 HEAD)
	dirty=""
	if [ -n "$$(git status --porcelain --untracked-files=normal -- . ':(exclude)_output')" ]; then dirty=.dirty; fi
	if desc=$$(git describe --tags --match 'v[0-9]*' --long 2>/dev/null); then
		rest=$${desc%-g*}; count=$${rest##*-}; tag=$${rest%-*}
		version=$${tag#v}; version=$${version//-/\~}
		if [ "$$count" = 0 ] && [ -z "$$dirty" ]; then release=1; else release=1.$$count.git$$hash$$dirty; fi
	else
		version=0.0.0; release=0.$$(git rev-list --count HEAD).git$$hash$$dirty
	fi
	buildversion=$$(git describe --tags --match 'v[0-9]*' --always)$${dirty:+-dirty}
else
	version=0.0.0; release=1; buildversion=""
fi
version=$${VERSION:-$$version}; release=$${RELEASE:-$$release}
buildversion=$${buildversion:-$$version-$$release}
endef

# Files of the source tree: what git tracks plus new files it does not ignore, never _output.
define source-files
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	git ls-files -z --cached --others --exclude-standard -- . ':(exclude)_output' | \
		while IFS= read -r -d '' f; do if [ -e "$$f" ]; then printf '%s\0' "$$f"; fi; done
else
	find . -path ./_output -prune -o -path ./.git -prune -o -path ./vendor -prune -o \
		\( -type f -o -type l \) -printf '%P\0'
fi
endef

.PHONY: rpm tarball clean

tarball:
	@$(rpm-version)
	name=layerstore-$$version
	rm -rf "$(TOPDIR)"
	mkdir -p "$(TOPDIR)"/{SOURCES,SPECS,BUILD,RPMS,SRPMS} "$(TOPDIR)/stage/$$name"
	$(source-files) | tar -c --null -T - -f - | tar -x -C "$(TOPDIR)/stage/$$name"
	# The modules the build needs, from the module cache (or the proxy): rpmbuild stays offline.
	(cd "$(TOPDIR)/stage/$$name" && env -u GOFLAGS GOWORK=off $(GO) mod vendor)
	mtime=$$(git log -1 --format=%ct 2>/dev/null || date +%s)
	tar -C "$(TOPDIR)/stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@$$mtime \
		-czf "$(TOPDIR)/SOURCES/$$name.tar.gz" "$$name"
	rm -rf "$(TOPDIR)/stage"
	echo "source tarball: $(TOPDIR)/SOURCES/$$name.tar.gz ($$version-$$release, built as $$buildversion)"

rpm: tarball
	@$(rpm-version)
	cp $(SPEC) "$(TOPDIR)/SPECS/"
	# rpmbuild checks BuildRequires against the rpm database. On hosts that are not RPM-based
	# (Debian, Ubuntu: rpm itself is not in that database) it is empty, so the check is skipped
	# there; golang and systemd-rpm-macros must then be present by other means (go on PATH),
	# and the spec brings its own fallbacks for the systemd macros.
	nodeps=""
	if ! rpm -q rpm >/dev/null 2>&1; then nodeps=--nodeps; echo "not an RPM-based host: rpmbuild --nodeps"; fi
	# The spec's %build runs `go` from PATH: the one this make uses, with its build cache
	# (content-addressed, so sharing it only saves time).
	PATH="$$($(GO) env GOROOT)/bin:$$PATH" GOCACHE="$$($(GO) env GOCACHE)" \
	$(RPMBUILD) -ba $$nodeps \
		--define "_topdir $(TOPDIR)" \
		--define "ls_version $$version" \
		--define "ls_release $$release" \
		--define "ls_buildversion $$buildversion" \
		"$(TOPDIR)/SPECS/$(notdir $(SPEC))"
	# RPM_OUTDIR holds the packages of this build only: earlier ones of layerstore go.
	mkdir -p "$(RPM_OUTDIR)"
	rm -f "$(RPM_OUTDIR)"/layerstore-*.rpm
	find "$(TOPDIR)/RPMS" "$(TOPDIR)/SRPMS" -name 'layerstore-*.rpm' -exec cp {} "$(RPM_OUTDIR)/" \;
	echo "RPMs in $(RPM_OUTDIR):"
	ls -1 "$(RPM_OUTDIR)"/layerstore-*.rpm

clean:
	rm -rf "$(OUTPUT)"
