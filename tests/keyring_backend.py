"""A real keyring backend for tests, kept in a JSON file (XZ_TEST_KEYRING_FILE): never the person's keyring."""

import json
import os

from keyring.backend import KeyringBackend
from keyring.errors import PasswordDeleteError


class FileKeyring(KeyringBackend):
    priority = 1

    def _path(self):
        return os.environ["XZ_TEST_KEYRING_FILE"]

    def _load(self):
        try:
            with open(self._path()) as fh:
                return json.load(fh)
        except FileNotFoundError:
            return {}

    def _save(self, data):
        with open(self._path(), "w") as fh:
            json.dump(data, fh)

    def get_password(self, service, username):
        return self._load().get("%s/%s" % (service, username))

    def set_password(self, service, username, password):
        data = self._load()
        data["%s/%s" % (service, username)] = password
        self._save(data)

    def delete_password(self, service, username):
        data = self._load()
        if data.pop("%s/%s" % (service, username), None) is None:
            raise PasswordDeleteError("not found")
        self._save(data)
