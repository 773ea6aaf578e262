"""The compiled matching core: Cython builds of the engine's hot modules, made by `setup.py`.

Nothing is written here by hand: `setup.py build_ext --inplace` (run by `scripts/bootstrap.sh`)
compiles `matching/{engine,book,matcher,stops,holds,validation}.py` into extension modules of this
package. Use `matching.compiled.engine_class()`, never these modules directly: it checks that the
build matches the current sources and falls back to the pure engine otherwise.
"""
