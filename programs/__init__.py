"""The bundled example programs (`.lpu` files beside this module), installed as package data."""
