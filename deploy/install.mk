# Installing tessera like a library (included by the Makefile):
#
#   make install PREFIX=/usr/local [DESTDIR=stage]   make uninstall (same args)
#
# PREFIX/bin           tessera, tessera-node, tessera-tracker
# PREFIX/lib           libtessera-client.so (.so.0, .so.VERSION) and .a
# PREFIX/lib/pkgconfig tessera-client.pc (relocatable: its paths follow the
#                      file, so a DESTDIR staging compiles against it as is)
# PREFIX/include       tessera_client.h
# PREFIX/lib/systemd/system  the units of deploy/systemd, their paths moved
#                      to PREFIX
# PREFIX/share/doc/tessera   README.md (the units' Documentation=), installed-dirs
#                      (the directories install made, for uninstall)
# PYTHONDIR            the `tessera` Python package, pip-installed from
#                      node/python with the client built into it (default
#                      PREFIX/lib/pythonX.Y/dist-packages: on Debian's
#                      sys.path for PREFIX=/usr/local)
#
# $(BUILD)/venv is a virtual environment (with the system's site packages:
# numpy and torch from Debian) where pip installed node/python: the tests
# and deploy/rl-loop.py run its python (`make venv`).

PREFIX     ?= /usr/local
DESTDIR    ?=
PYTHON3    ?= /usr/bin/python3
INST_BIN    = $(DESTDIR)$(PREFIX)/bin
INST_LIB    = $(DESTDIR)$(PREFIX)/lib
INST_INC    = $(DESTDIR)$(PREFIX)/include
INST_UNITS  = $(DESTDIR)$(PREFIX)/lib/systemd/system
INST_DOC    = $(DESTDIR)$(PREFIX)/share/doc/tessera
PYTHONDIR  ?= $(PREFIX)/lib/$(shell $(PYTHON3) -c 'import sys; print("python%d.%d" % sys.version_info[:2])' 2>/dev/null)/dist-packages
UNITS      := $(wildcard deploy/systemd/*.service)
PIP_LOCAL  := --no-index --no-build-isolation --no-deps --disable-pip-version-check \
              --root-user-action=ignore
CLIENT_PC  := $(BUILD)/lib/pkgconfig/tessera-client.pc

$(CLIENT_PC): node/client/tessera-client.pc.in proto/cli.h
	@mkdir -p $(dir $@)
	sed 's/@VERSION@/$(RELEASE)/' $< >$@

# The directories install made (none of them there before), recorded
# without DESTDIR in INST_DIRS_MADE: uninstall removes those left empty,
# never one that was there already (/usr/local/bin on a fresh system).
INST_DIRS      = $(INST_BIN) $(INST_LIB)/pkgconfig $(INST_INC) $(INST_UNITS) $(INST_DOC) \
                 $(DESTDIR)$(PYTHONDIR)
INST_DIRS_MADE = $(INST_DOC)/installed-dirs

install: $(BINS) $(CLIENT_LIBS) $(CLIENT_PC)
	@for d in $(INST_DIRS); do \
		while [ ! -d "$$d" ]; do echo "$${d#$(DESTDIR)}"; d=$$(dirname "$$d"); done; \
	done | grep -v '^$$' | sort -u >$(BUILD)/install-dirs-new
	install -d $(INST_DIRS)
	@cat $(BUILD)/install-dirs-new $$(test -f $(INST_DIRS_MADE) && echo $(INST_DIRS_MADE)) | \
		sort -u >$(BUILD)/install-dirs && install -m 0644 $(BUILD)/install-dirs $(INST_DIRS_MADE)
	install -m 0755 $(BINS) $(INST_BIN)/
	install -m 0644 $(BUILD)/lib/libtessera-client.a $(INST_LIB)/
	install -m 0755 $(BUILD)/lib/libtessera-client.so $(INST_LIB)/libtessera-client.so.$(RELEASE)
	ln -sf libtessera-client.so.$(RELEASE) $(INST_LIB)/libtessera-client.so.$(CLIENT_ABI)
	ln -sf libtessera-client.so.$(CLIENT_ABI) $(INST_LIB)/libtessera-client.so
	install -m 0644 $(CLIENT_PC) $(INST_LIB)/pkgconfig/
	install -m 0644 node/client/tessera_client.h $(INST_INC)/
	for u in $(UNITS); do \
		sed -e 's|/usr/local/bin/|$(PREFIX)/bin/|g' \
		    -e 's|/usr/local/share/doc/tessera|$(PREFIX)/share/doc/tessera|g' \
		    "$$u" >$(INST_UNITS)/$$(basename "$$u") || exit 1; \
	done
	install -m 0644 README.md $(INST_DOC)/
	$(PYTHON3) -m pip install -q $(PIP_LOCAL) --upgrade --target $(DESTDIR)$(PYTHONDIR) node/python
	@echo "installed tessera $(RELEASE) in $(DESTDIR)$(PREFIX) (Python package in $(DESTDIR)$(PYTHONDIR))"
	@# The loader's cache, for a prefix it searches (/usr/local): as root,
	@# installing for this system (no DESTDIR). Another prefix needs the
	@# program's rpath or LD_LIBRARY_PATH (node/client/README.md).
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v ldconfig >/dev/null && \
	    ldconfig -v -N -X 2>/dev/null | grep -q "^$(PREFIX)/lib:"; then \
		ldconfig && echo "ran ldconfig: $(PREFIX)/lib is in the loader's path"; \
	else \
		echo "$(PREFIX)/lib is not in the loader's cache: link with -Wl,-rpath,$(PREFIX)/lib" \
		     "or set LD_LIBRARY_PATH (node/client/README.md)"; \
	fi

uninstall:
	rm -f $(addprefix $(INST_BIN)/,$(notdir $(BINS))) \
	      $(addprefix $(INST_LIB)/libtessera-client.,a so so.$(CLIENT_ABI) so.$(RELEASE)) \
	      $(INST_LIB)/pkgconfig/tessera-client.pc $(INST_INC)/tessera_client.h \
	      $(addprefix $(INST_UNITS)/,$(notdir $(UNITS))) $(INST_DOC)/README.md
	rm -rf $(DESTDIR)$(PYTHONDIR)/tessera $(DESTDIR)$(PYTHONDIR)/tessera-*.dist-info
	@n=0; if [ -f $(INST_DIRS_MADE) ]; then \
		made=$$(sort -r $(INST_DIRS_MADE)); rm -f $(INST_DIRS_MADE); \
		for d in $$made; do \
			[ -d "$(DESTDIR)$$d" ] || continue; \
			rmdir --ignore-fail-on-non-empty "$(DESTDIR)$$d"; \
			[ -d "$(DESTDIR)$$d" ] || n=$$((n + 1)); \
		done; \
	fi; \
	echo "removed tessera from $(DESTDIR)$(PREFIX) (Python package from $(DESTDIR)$(PYTHONDIR));" \
	     "$$n empty directories it had made"

# The tests' Python: pip installs node/python again whenever the package or
# the client changes.
VENV := $(BUILD)/venv
$(VENV)/installed: node/python/pyproject.toml node/python/setup.py $(wildcard node/python/tessera/*.py) \
		$(CLIENT_SRCS) node/client/tessera_client.h node/client/wire.h proto/cli.h
	@test -x $(VENV)/bin/python3 || $(PYTHON3) -m venv --system-site-packages $(VENV)
	$(VENV)/bin/python3 -m pip install -q $(PIP_LOCAL) --force-reinstall node/python
	@touch $@
venv: $(VENV)/installed
